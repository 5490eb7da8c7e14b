//! A client for idgen, the distributed unique-ID service.
//!
//! It finds nodes (a static list, or Consul's health API watched with
//! blocking queries, configured like the consul CLI: `CONSUL_HTTP_ADDR`,
//! `CONSUL_HTTP_TOKEN` and the rest, see [`ConsulEnv`]), spreads calls over them (power of two choices on
//! calls in flight), retries on another node when one is unavailable, and
//! can prefetch IDs so that most calls are served from memory without a
//! lock or a wait.
//!
//! ```no_run
//! # async fn run() -> Result<(), idgen_client::Error> {
//! use std::time::Duration;
//! use idgen_client::{Client, ConsulDiscovery, Mode};
//!
//! let client = Client::builder()
//!     .consul(ConsulDiscovery::new("http://127.0.0.1:8500").service("idgen"))
//!     .deadline(Duration::from_secs(1))
//!     .build()
//!     .await?;
//! // One call to a node per ID:
//! let id = client.gen_id(Mode::Snowflake, "").await?;
//! // From a local buffer refilled in the background:
//! let order_id = client.next_id(Mode::Segment, "orders").await?;
//! // UUIDv7 the same way, from a buffer refilled with GenUuids:
//! let key = client.next_uuid().await?;
//! // Strict values always come from a node (never prefetched):
//! let seat = client.gen_id(Mode::Strict, "flights/lh400").await?;
//! // Formatted IDs (a format defined on the nodes), with its parameters:
//! let numbers = client.gen_formatted("invoices", [("shop", "eu")], 3).await?;
//! # let _ = (id, order_id, key, seat, numbers.ids); Ok(()) }
//! ```
//!
//! # Guarantees
//! - An ID is handed out by the client at most once: a prefetched batch is
//!   claimed index by index with one atomic operation per ID (see the loom
//!   model in `client/loom`).
//! - IDs are lost (never handed out) only as gaps: prefetched IDs still
//!   buffered when the client is dropped, snowflake IDs older than
//!   [`PrefetchConfig::max_snowflake_age`], and requests that a node may
//!   have served but whose answer never arrived.
//! - Strict calls are never prefetched and are retried on another node
//!   only when the request provably did not reach a node. Calls on one
//!   strict key go to one node while it is up (rendezvous hashing on the
//!   key), which combines them into shared writes.
//!
//! # Layout
//! - `call`: one call with node choice, retry, backoff and deadline.
//! - `nodes`: the node set, power of two choices (or a strict key's own
//!   node), setting nodes aside and probing their health.
//! - `discovery`: static lists and the Consul watch; `consul_env`:
//!   Consul's own environment variables ([`ConsulEnv`]).
//! - `buffer`: the lock-free buffer (of IDs or UUIDs); `prefetch`: its
//!   refills and adaptive batch size.
//! - `tls`: dialling nodes over TLS ([`TlsConfig`]), and the one set of
//!   words for a TLS refusal ([`tls_refusal`]).
//! - [`pem`]: the one reader of TLS files (PEM), for this crate, the
//!   `idgen` command and the node.
//! - `port_probe`: what a port that failed a call speaks (an HTTP/1.1
//!   port is named as such: [`speaks_http1`]; a TLS one: [`speaks_tls`]).
//! - [`blocking`]: the same client for code without an async runtime.
//! - [`metrics`]: metric names.

#![warn(missing_docs)]

pub mod blocking;
mod buffer;
mod call;
mod consul_env;
mod discovery;
mod error;
pub mod metrics;
mod nodes;
pub mod pem;
mod port_probe;
mod prefetch;
mod sync;
mod tls;
mod uuid;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use idgen_proto::id_gen_client::IdGenClient;
use idgen_proto::{
    DecodeIdRequest, DecodeUuidRequest, GenFormattedRequest, GenIdRequest, GenIdsRequest,
    GenUuidRequest, GenUuidsRequest, GetFormatCounterRequest, ParseFormattedRequest,
};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::Channel;

use crate::call::{CallSettings, Caller, Counted, Retry};
pub use crate::consul_env::{ConsulEnv, DEFAULT_CONSUL_ADDR};
use crate::discovery::ConsulWatch;
pub use crate::discovery::{ConsulDiscovery, ConsulTls};
pub use crate::error::Error;
use crate::nodes::{NodeSet, NodeSettings, Route};
pub use crate::port_probe::{speaks_http1, speaks_tls};
pub use crate::prefetch::{PrefetchConfig, Prefetcher, UuidPrefetcher};
pub use crate::tls::{tls_refusal, TlsConfig, TlsRemedies, TlsUse};
pub use crate::uuid::Uuid;
pub use idgen_proto::{
    DecodeIdResponse, DecodeUuidResponse, GenFormattedResponse, GetFormatCounterResponse, Mode,
    ParseFormattedResponse,
};

/// The nodes' admin token, kept out of `Debug` output.
#[derive(Clone)]
struct AdminToken(String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    endpoints: Vec<String>,
    consul: Option<ConsulDiscovery>,
    deadline: Duration,
    attempt_timeout: Option<Duration>,
    connect_timeout: Duration,
    set_aside: Duration,
    backoff_base: Duration,
    backoff_max: Duration,
    prefetch: PrefetchConfig,
    tls: Option<TlsConfig>,
    admin_token: Option<AdminToken>,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            consul: None,
            deadline: Duration::from_secs(2),
            attempt_timeout: None,
            connect_timeout: Duration::from_millis(500),
            set_aside: Duration::from_secs(1),
            backoff_base: Duration::from_millis(5),
            backoff_max: Duration::from_millis(100),
            prefetch: PrefetchConfig::default(),
            tls: None,
            admin_token: None,
        }
    }
}

impl ClientBuilder {
    /// Static node addresses (`host:port` of the gRPC port).
    pub fn endpoints<S: Into<String>>(mut self, endpoints: impl IntoIterator<Item = S>) -> Self {
        self.endpoints = endpoints.into_iter().map(Into::into).collect();
        self
    }

    /// Finds the nodes in Consul instead (the passing instances of the
    /// service, followed with blocking queries).
    pub fn consul(mut self, consul: ConsulDiscovery) -> Self {
        self.consul = Some(consul);
        self
    }

    /// The longest a call may take, retries and refill waits included
    /// (default 2 s).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The longest one attempt on one node may take before the call moves
    /// to another node (default: a third of the deadline, so a stalled
    /// node, e.g. one stopped with SIGSTOP, leaves time for two more).
    /// Capped by the time left of the deadline. A strict call is not sent
    /// again after its attempt timed out (the node may have taken a value).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// The longest a connection attempt to a node may take (default 500 ms).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a node that answered UNAVAILABLE is left out before its
    /// health is probed again (default 1 s).
    pub fn set_aside(mut self, period: Duration) -> Self {
        self.set_aside = period;
        self
    }

    /// Backoff between retries: full jitter up to `base * 2^attempt`,
    /// capped at `max` (defaults 5 ms and 100 ms).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// Dial every node over TLS (default: plaintext). Without it, a node
    /// that serves TLS fails every call and is set aside.
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Prefetch batch sizes and ages.
    pub fn prefetch(mut self, prefetch: PrefetchConfig) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// The nodes' admin token (their `admin.token`), sent as
    /// `authorization: Bearer <token>` with [`Client::decode_id`],
    /// [`Client::decode_uuid`], [`Client::parse_formatted`] and [`Client::format_counter`] only,
    /// never with calls that make IDs: with it, a hidden ID decodes to its
    /// internal value and parts and a hidden format's counter is shown
    /// (the node audit-logs each reveal); without it, callers get the
    /// public view and no hidden counter. Use TLS ([`tls`](Self::tls)) when the token crosses a
    /// network. Nodes that check client certificates instead reveal to
    /// the certificate given in [`TlsConfig`] without a token.
    pub fn admin_token(mut self, token: impl Into<String>) -> Self {
        self.admin_token = Some(AdminToken(token.into()));
        self
    }

    /// Starts the client: with Consul, asks for the nodes once (and fails
    /// if Consul cannot answer), then watches in the background. Must run
    /// inside a tokio runtime.
    pub async fn build(self) -> Result<Client, Error> {
        if self.deadline.is_zero() {
            return Err(Error::Config("the deadline must be above zero".into()));
        }
        if self.attempt_timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::Config(
                "the attempt timeout must be above zero".into(),
            ));
        }
        if self.set_aside.is_zero() {
            return Err(Error::Config(
                "the set-aside period must be above zero".into(),
            ));
        }
        self.prefetch.validate().map_err(Error::Config)?;
        let admin = self.admin_token.as_ref().map(bearer).transpose()?;
        let tls = self.tls.as_ref().map(TlsConfig::build).transpose()?;
        let nodes = Arc::new(NodeSet::new(NodeSettings {
            connect_timeout: self.connect_timeout,
            set_aside: self.set_aside,
            tls,
            counters_may_cross: self
                .consul
                .as_ref()
                .is_some_and(|c| c.counters_may_cross_datacenters),
        }));
        match (&self.consul, self.endpoints.is_empty()) {
            (Some(_), false) => {
                return Err(Error::Config(
                    "give either static endpoints or Consul discovery, not both".into(),
                ))
            }
            (None, true) => {
                return Err(Error::Config(
                    "no endpoints: give static endpoints or Consul discovery".into(),
                ))
            }
            (None, false) => nodes.replace(&self.endpoints).map_err(Error::Config)?,
            (Some(consul), true) => {
                let watch = ConsulWatch::new(consul.clone()).map_err(Error::Config)?;
                watch.check_fallback_names().await.map_err(Error::Config)?;
                let index = watch.first(&nodes).await.map_err(Error::Discovery)?;
                tokio::spawn(watch.run(Arc::downgrade(&nodes), index));
            }
        }
        let caller = Arc::new(Caller {
            nodes,
            settings: CallSettings {
                deadline: self.deadline,
                attempt_timeout: self.attempt_timeout.unwrap_or(self.deadline / 3),
                backoff_base: self.backoff_base,
                backoff_max: self.backoff_max,
            },
        });
        Ok(Client {
            caller,
            admin,
            prefetch: self.prefetch,
            runtime: tokio::runtime::Handle::current(),
            prefetchers: Arc::new(Mutex::new(HashMap::new())),
            uuid_prefetcher: Arc::new(OnceLock::new()),
        })
    }
}

/// A client for an idgen cluster. Cheap to clone; clones share nodes and
/// prefetch buffers.
#[derive(Debug, Clone)]
pub struct Client {
    caller: Arc<Caller>,
    /// `Bearer <admin token>`, marked sensitive (never in `Debug`).
    admin: Option<AsciiMetadataValue>,
    prefetch: PrefetchConfig,
    runtime: tokio::runtime::Handle,
    prefetchers: Arc<Mutex<HashMap<(Mode, String), Prefetcher>>>,
    /// The one UUID buffer, created on first use.
    uuid_prefetcher: Arc<OnceLock<UuidPrefetcher>>,
}

impl Client {
    /// Starts building a client.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// One ID from a node (`GenId`). `tag` is the segment tag or the
    /// strict key (`<namespace>/<key>`); empty for snowflake and lease.
    pub async fn gen_id(&self, mode: Mode, tag: &str) -> Result<u64, Error> {
        let retry = retry_for(mode);
        self.caller
            .call_routed(
                "GenId",
                retry,
                route_for(mode, tag),
                Counted::Mode(mode, tag),
                |mut c, left| {
                    let mut req = tonic::Request::new(GenIdRequest {
                        mode: mode as i32,
                        tag: tag.to_owned(),
                    });
                    req.set_timeout(left);
                    async move { c.gen_id(req).await.map(|r| r.into_inner().id) }
                },
            )
            .await
    }

    /// `count` IDs from a node in one call (`GenIds`); strict: `count`
    /// consecutive values.
    pub async fn gen_ids(&self, mode: Mode, tag: &str, count: u32) -> Result<Vec<u64>, Error> {
        self.gen_ids_from(mode, tag, count)
            .await
            .map(|(ids, _)| ids)
    }

    /// [`Client::gen_ids`], with the address (`host:port`) of the node
    /// that answered: after a failover it is not the first one tried, and
    /// a strict key's answer from another node than
    /// [`Client::strict_node`] shows that the key's node was set aside or
    /// could not be reached.
    pub async fn gen_ids_from(
        &self,
        mode: Mode,
        tag: &str,
        count: u32,
    ) -> Result<(Vec<u64>, String), Error> {
        let retry = retry_for(mode);
        self.caller
            .call_routed_from(
                "GenIds",
                retry,
                route_for(mode, tag),
                Counted::Mode(mode, tag),
                |mut c, left| {
                    let mut req = tonic::Request::new(GenIdsRequest {
                        mode: mode as i32,
                        tag: tag.to_owned(),
                        count,
                    });
                    req.set_timeout(left);
                    async move { c.gen_ids(req).await.map(|r| r.into_inner().ids) }
                },
            )
            .await
    }

    /// The prefetch buffer for (mode, tag), created on first use. Strict
    /// mode is refused ([`Error::StrictNotPrefetchable`]).
    pub fn prefetcher(&self, mode: Mode, tag: &str) -> Result<Prefetcher, Error> {
        if mode == Mode::Strict {
            return Err(Error::StrictNotPrefetchable);
        }
        let mode = if mode == Mode::Unspecified {
            Mode::Snowflake
        } else {
            mode
        };
        let mut map = self.prefetchers.lock().unwrap_or_else(|e| e.into_inner());
        let p = map.entry((mode, tag.to_owned())).or_insert_with(|| {
            Prefetcher::new(
                Arc::clone(&self.caller),
                self.runtime.clone(),
                mode,
                tag.to_owned(),
                self.prefetch.clone(),
            )
        });
        Ok(p.clone())
    }

    /// The next ID of (mode, tag) from its prefetch buffer; strict values
    /// come from a node on every call. For the fastest path keep the
    /// [`Prefetcher`] from [`Client::prefetcher`] instead of looking it up
    /// on each call.
    pub async fn next_id(&self, mode: Mode, tag: &str) -> Result<u64, Error> {
        if mode == Mode::Strict {
            return self.gen_id(mode, tag).await;
        }
        self.prefetcher(mode, tag)?.next_id().await
    }

    /// The prefetch buffer of UUIDv7, created on first use (one per
    /// client: UUIDs have no mode or tag).
    pub fn uuid_prefetcher(&self) -> UuidPrefetcher {
        self.uuid_prefetcher
            .get_or_init(|| {
                UuidPrefetcher::new(
                    Arc::clone(&self.caller),
                    self.runtime.clone(),
                    self.prefetch.clone(),
                )
            })
            .clone()
    }

    /// The next UUIDv7 from the client's UUID prefetch buffer (refilled
    /// in the background with `GenUuids`, like [`Client::next_id`]). For
    /// the fastest path keep the [`UuidPrefetcher`] from
    /// [`Client::uuid_prefetcher`].
    pub async fn next_uuid(&self) -> Result<Uuid, Error> {
        self.uuid_prefetcher().next_uuid().await
    }

    /// `count` formatted IDs of `format` (`GenFormatted`), e.g. order
    /// numbers, with the format's parameters. Always a call to a node,
    /// never prefetched (periods and rules decide each ID when it is
    /// taken); a node that is unavailable is left for another, which gives
    /// IDs from its own counters (an answer lost on the way is a gap, never
    /// a repeat). `count` 0 means 1.
    pub async fn gen_formatted(
        &self,
        format: &str,
        params: impl IntoIterator<Item = (impl Into<String>, impl Into<String>)>,
        count: u32,
    ) -> Result<GenFormattedResponse, Error> {
        let params = param_map(params);
        let req = || GenFormattedRequest {
            format: format.to_owned(),
            params: params.clone(),
            count,
        };
        self.caller
            .call_routed(
                "GenFormatted",
                Retry::Idempotent,
                Route::Spread,
                Counted::Format(format),
                |mut c, left| {
                    let mut req = tonic::Request::new(req());
                    req.set_timeout(left);
                    async move { c.gen_formatted(req).await.map(|r| r.into_inner()) }
                },
            )
            .await
    }

    /// The fields of formatted ID `id` of `format` (`ParseFormatted`):
    /// time fields, node or token, counter, parameters. Of a hidden
    /// counter, the internal counter and key version too when the client
    /// has the [admin token](ClientBuilder::admin_token).
    pub async fn parse_formatted(
        &self,
        format: &str,
        id: &str,
    ) -> Result<ParseFormattedResponse, Error> {
        let req = || {
            self.authorized(ParseFormattedRequest {
                format: format.to_owned(),
                id: id.to_owned(),
            })
        };
        self.unary_request("ParseFormatted", req, |mut c, req| async move {
            c.parse_formatted(req).await.map(|r| r.into_inner())
        })
        .await
    }

    /// The parts of `id`, made in `mode` (`DecodeId`; `Mode::Unspecified`
    /// means snowflake), under the answering node's layout. Of a hidden
    /// ID, the internal ID and its parts too when the client has the
    /// [admin token](ClientBuilder::admin_token); the public view
    /// otherwise.
    pub async fn decode_id(&self, id: u64, mode: Mode) -> Result<DecodeIdResponse, Error> {
        self.decode_request(id, mode, "").await
    }

    /// What `id` of hidden segment tag `tag` shows (`DecodeId` with mode
    /// segment and the tag): `hidden = "tag"` and the `key_version` to
    /// anyone; the `internal_id` (the tag's counter) too when the client
    /// has the [admin token](ClientBuilder::admin_token), audit-logged by
    /// the node. A plain tag's IDs have no parts: INVALID_ARGUMENT.
    pub async fn decode_segment_id(&self, tag: &str, id: u64) -> Result<DecodeIdResponse, Error> {
        self.decode_request(id, Mode::Segment, tag).await
    }

    async fn decode_request(
        &self,
        id: u64,
        mode: Mode,
        tag: &str,
    ) -> Result<DecodeIdResponse, Error> {
        let req = || {
            self.authorized(DecodeIdRequest {
                id,
                mode: mode as i32,
                tag: tag.to_owned(),
            })
        };
        self.unary_request("DecodeId", req, |mut c, req| async move {
            c.decode_id(req).await.map(|r| r.into_inner())
        })
        .await
    }

    /// One UUIDv7 (`GenUuid`): unique across the cluster, increasing per
    /// node. Retried on another node like a snowflake call (any node's
    /// UUIDs differ from every other node's).
    pub async fn gen_uuid(&self) -> Result<Uuid, Error> {
        let response = self
            .unary(
                "GenUuid",
                || GenUuidRequest {},
                |mut c, req| async move { c.gen_uuid(req).await.map(|r| r.into_inner()) },
            )
            .await?;
        Uuid::from_slice(&response.uuid).ok_or_else(|| Error::BadAnswer {
            what: format!("GenUuid answered {} bytes, not 16", response.uuid.len()),
        })
    }

    /// `count` UUIDv7 in one call (`GenUuids`), strictly increasing.
    pub async fn gen_uuids(&self, count: u32) -> Result<Vec<Uuid>, Error> {
        let response = self
            .unary(
                "GenUuids",
                || GenUuidsRequest {
                    count,
                    with_text: false,
                },
                |mut c, req| async move { c.gen_uuids(req).await.map(|r| r.into_inner()) },
            )
            .await?;
        uuid::uuids_of(&response.uuids, count)
    }

    /// The parts of a UUIDv7 (`DecodeUuid`): canonical text, 32 hex
    /// digits or a ULID. Of a hidden layout's UUID, the internal UUID and
    /// its parts too when the client has the
    /// [admin token](ClientBuilder::admin_token); its time and key version
    /// otherwise.
    pub async fn decode_uuid(&self, text: &str) -> Result<DecodeUuidResponse, Error> {
        let req = || {
            self.authorized(DecodeUuidRequest {
                text: text.to_owned(),
                uuid: Vec::new(),
            })
        };
        self.unary_request("DecodeUuid", req, |mut c, req| async move {
            c.decode_uuid(req).await.map(|r| r.into_inner())
        })
        .await
    }

    /// `message` as a request carrying the admin token, when there is one.
    fn authorized<T>(&self, message: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(message);
        if let Some(admin) = &self.admin {
            req.metadata_mut().insert("authorization", admin.clone());
        }
        req
    }

    /// A counter's durable record (`GetFormatCounter`): whether it was
    /// used, the start of the period it is in, the last value any node may
    /// have used. `params` are the format's scope parameters. Per-node
    /// formats show the counter of the node that answers. A hidden
    /// format's counter tells how many IDs it issued: nodes answer it only
    /// to a client with the [admin token](ClientBuilder::admin_token)
    /// (UNAUTHENTICATED otherwise).
    pub async fn format_counter(
        &self,
        format: &str,
        params: impl IntoIterator<Item = (impl Into<String>, impl Into<String>)>,
    ) -> Result<GetFormatCounterResponse, Error> {
        let params = param_map(params);
        let req = || {
            self.authorized(GetFormatCounterRequest {
                format: format.to_owned(),
                params: params.clone(),
            })
        };
        self.unary_request("GetFormatCounter", req, |mut c, req| async move {
            c.get_format_counter(req).await.map(|r| r.into_inner())
        })
        .await
    }

    /// One idempotent call of `method` with failover: each attempt sends a
    /// fresh `request()` with the time left as its gRPC timeout.
    async fn unary<Req, Resp, Fut>(
        &self,
        method: &'static str,
        request: impl Fn() -> Req,
        send: impl Fn(IdGenClient<Channel>, tonic::Request<Req>) -> Fut,
    ) -> Result<Resp, Error>
    where
        Fut: std::future::Future<Output = Result<Resp, tonic::Status>>,
    {
        self.unary_request(method, || tonic::Request::new(request()), send)
            .await
    }

    /// [`unary`](Self::unary) with a whole request (metadata included).
    async fn unary_request<Req, Resp, Fut>(
        &self,
        method: &'static str,
        request: impl Fn() -> tonic::Request<Req>,
        send: impl Fn(IdGenClient<Channel>, tonic::Request<Req>) -> Fut,
    ) -> Result<Resp, Error>
    where
        Fut: std::future::Future<Output = Result<Resp, tonic::Status>>,
    {
        self.caller
            .call(method, Retry::Idempotent, |c, left| {
                let mut req = request();
                req.set_timeout(left);
                send(c, req)
            })
            .await
    }

    /// The node a strict call on `key` goes to now (rendezvous hashing
    /// over the nodes in use, FNV-1a of the key; set-aside nodes skipped
    /// while others are up), or `None` with no node known. Every idgen
    /// client computes the same answer, so calls on one key meet on one
    /// node whatever language makes them.
    pub fn strict_node(&self, key: &str) -> Option<String> {
        self.caller.nodes.key_node(key)
    }

    /// The gRPC addresses of the nodes currently known.
    pub fn nodes(&self) -> Vec<String> {
        self.caller.nodes.addrs()
    }
}

/// `Bearer <token>` as a sensitive header value; a token a header cannot
/// carry is refused.
fn bearer(token: &AdminToken) -> Result<AsciiMetadataValue, Error> {
    if token.0.trim().is_empty() {
        return Err(Error::Config("the admin token is empty".into()));
    }
    let mut value = MetadataValue::try_from(format!("Bearer {}", token.0)).map_err(|_| {
        Error::Config(
            "the admin token cannot be sent in a header: it must be visible ASCII (no line breaks or control characters)".into(),
        )
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// A format's parameters as the request carries them.
fn param_map(
    params: impl IntoIterator<Item = (impl Into<String>, impl Into<String>)>,
) -> HashMap<String, String> {
    params
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
}

fn retry_for(mode: Mode) -> Retry {
    if mode == Mode::Strict {
        Retry::OnlyIfNotSent
    } else {
        Retry::Idempotent
    }
}

/// Strict calls on one key go to the key's node (rendezvous hashing over
/// the nodes in use): that node combines them into shared writes, where
/// calls spread over the cluster would race each other's writes on the
/// same key and retry. Values stay linearizable whichever node serves
/// them; this is only about throughput. Other modes spread the load.
fn route_for(mode: Mode, tag: &str) -> Route {
    if mode == Mode::Strict {
        Route::Key(nodes::key_hash(tag))
    } else {
        Route::Spread
    }
}
