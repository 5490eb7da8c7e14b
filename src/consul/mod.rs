//! A thin Consul HTTP client: exactly the calls whose behaviour
//! `consul/README.md` documents (checked against Consul's own source),
//! typed, with timeouts on every call and retries only where they are safe.
//!
//! # Retries
//! A read, a session renew or destroy, and an agent (de)registration can be
//! repeated without changing the outcome, so they are retried on transport
//! errors, 429 and 5xx with jittered exponential backoff. A KV write (even
//! a plain set, which a late first attempt could undo) and a txn are **never** retried
//! here: a timeout or 5xx may or may not have been applied, and only the
//! caller knows how to re-read and decide ([`ConsulError::outcome_unknown`]).
//!
//! # Secrets
//! The ACL token travels in the `X-Consul-Token` header only; it never
//! appears in a URL, a log line or a `Debug` print.

pub mod tls;
pub mod types;

use std::fmt;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use thiserror::Error;

use crate::metrics as m;

pub use tls::{ConsulTls, ConsulTlsError, ConsulTlsFiles};
pub use types::{
    Consistency, KvEntry, KvWrite, ServiceCheck, ServiceEntry, ServiceRegistration,
    SessionBehavior, SessionInfo, SessionSpec, TxnError, TxnOp, TxnOutcome,
};

/// How to reach Consul.
#[derive(Clone)]
pub struct ConsulConfig {
    /// Base URL of the agent, e.g. `http://127.0.0.1:8500`.
    pub address: String,
    /// ACL token, sent as `X-Consul-Token`.
    pub acl_token: Option<String>,
    /// Timeout of one request (blocking queries add their wait on top).
    pub timeout: Duration,
    /// Extra attempts for a retryable failure of a safe call.
    pub retries: u32,
    /// First backoff; doubles per attempt, with full jitter.
    pub backoff: Duration,
    /// HTTPS settings; required by, and only allowed with, an `https://`
    /// address.
    pub tls: Option<ConsulTls>,
}

impl Default for ConsulConfig {
    fn default() -> Self {
        Self {
            address: "http://127.0.0.1:8500".into(),
            acl_token: None,
            timeout: Duration::from_secs(5),
            retries: 3,
            backoff: Duration::from_millis(50),
            tls: None,
        }
    }
}

impl fmt::Debug for ConsulConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulConfig")
            .field("address", &self.address)
            .field("acl_token", &self.acl_token.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("backoff", &self.backoff)
            .field("tls", &self.tls)
            .finish()
    }
}

/// What went wrong talking to Consul.
#[derive(Debug, Clone, Error)]
pub enum ConsulError {
    /// The configured address is not a usable `http://host:port` URL.
    #[error("bad Consul address {0:?}: use a URL like http://127.0.0.1:8500")]
    BadAddress(String),
    /// The address's scheme and the TLS settings, or the agent, disagree:
    /// `http://` to an HTTPS agent, `https://` to a plaintext one, or
    /// `https://` without a CA.
    #[error("Consul at {address}: {detail}")]
    WrongScheme {
        /// Agent address.
        address: String,
        /// What disagrees and what to change.
        detail: String,
    },
    /// The TLS handshake with the agent failed: its certificate is not
    /// trusted, or it refused ours. Nothing was sent.
    #[error("TLS with Consul at {address} failed ({endpoint}): {detail}")]
    Tls {
        /// Agent address.
        address: String,
        /// Which call.
        endpoint: &'static str,
        /// What failed and what to change.
        detail: String,
    },
    /// No answer: connection refused, reset, or timed out.
    #[error("cannot reach Consul at {address} ({endpoint}): {detail}")]
    Unreachable {
        /// Agent address.
        address: String,
        /// Which call.
        endpoint: &'static str,
        /// What the transport said.
        detail: String,
        /// The request may have reached Consul (a timeout after sending).
        maybe_sent: bool,
    },
    /// 403: the ACL token lacks a permission.
    #[error("Consul denied {endpoint} (403 permission denied): check that the ACL token has the policy in consul/acl-policy.hcl")]
    PermissionDenied {
        /// Which call.
        endpoint: &'static str,
    },
    /// The agent forgot a TTL check (it restarted): register again.
    #[error("Consul agent does not know check {check_id:?}; the service must be registered again")]
    UnknownCheck {
        /// The check id.
        check_id: String,
    },
    /// Any other non-success status.
    #[error("Consul answered {status} to {endpoint}: {body}")]
    Status {
        /// Which call.
        endpoint: &'static str,
        /// HTTP status.
        status: u16,
        /// The response text (Consul's error message).
        body: String,
    },
    /// The answer did not have the documented shape.
    #[error("unexpected answer from Consul to {endpoint}: {detail}")]
    Decode {
        /// Which call.
        endpoint: &'static str,
        /// What did not parse.
        detail: String,
    },
}

impl ConsulError {
    /// Whether repeating the same request may succeed (transport errors,
    /// 429, 5xx).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Unreachable { .. } => true,
            Self::Status { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }

    /// Whether a write that failed this way may nevertheless have been
    /// applied (Consul's documented behaviour: "a write that timed out or returned 5xx may
    /// still have been applied"). Such a write must be treated as not
    /// having happened for reservations, and re-read before deciding.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Self::Unreachable { maybe_sent, .. } => *maybe_sent,
            Self::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

/// One HTTP answer: status, `X-Consul-Index`, body.
struct Reply {
    status: StatusCode,
    index: u64,
    body: bytes::Bytes,
}

/// One request, built up before it is sent.
struct Call<'a> {
    method: Method,
    endpoint: &'static str,
    path: String,
    query: Vec<(&'a str, String)>,
    body: Option<Vec<u8>>,
    safety: Safety,
    extra_timeout: Duration,
}

impl<'a> Call<'a> {
    /// An idempotent request with no query and no body.
    fn new(method: Method, endpoint: &'static str, path: String) -> Self {
        Self {
            method,
            endpoint,
            path,
            query: Vec::new(),
            body: None,
            safety: Safety::Idempotent,
            extra_timeout: Duration::ZERO,
        }
    }

    fn query(mut self, query: Vec<(&'a str, String)>) -> Self {
        self.query = query;
        self
    }

    fn body(mut self, body: Vec<u8>) -> Self {
        self.body = Some(body);
        self
    }

    /// Never repeat: the outcome matters.
    fn once(self) -> Self {
        self.safety(Safety::Once)
    }

    fn safety(mut self, safety: Safety) -> Self {
        self.safety = safety;
        self
    }

    /// Extra client timeout (blocking queries).
    fn extra_timeout(mut self, extra: Duration) -> Self {
        self.extra_timeout = extra;
        self
    }
}

/// Whether a call may be repeated after a retryable failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Safety {
    /// Repeating cannot change the outcome.
    Idempotent,
    /// Outcome matters; never repeat blindly.
    Once,
}

/// What `/v1/agent/self` says about datacenters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentDatacenters {
    /// The agent's own Consul datacenter.
    pub datacenter: String,
    /// Its `primary_datacenter`; empty when not reported.
    pub primary: String,
}

/// A Consul agent client. Cheap to clone (one connection pool).
#[derive(Clone)]
pub struct ConsulClient {
    http: reqwest::Client,
    base: String,
    acl_token: Option<String>,
    config: ConsulConfig,
    /// `?dc=` sent with every request: another Consul datacenter, reached
    /// through the local agent (Consul forwards the request to that
    /// datacenter's servers). `None`: the agent's own.
    datacenter: Option<String>,
}

impl fmt::Debug for ConsulClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulClient")
            .field("config", &self.config)
            .finish()
    }
}

impl ConsulClient {
    /// A client for `config.address`. Fails on a malformed address, and
    /// when the scheme and the TLS settings disagree (`https://` needs
    /// [`ConsulConfig::tls`], `http://` must not have it).
    pub fn new(config: ConsulConfig) -> Result<Self, ConsulError> {
        let base = config.address.trim_end_matches('/').to_owned();
        let url = reqwest::Url::parse(&base).map_err(|_| ConsulError::BadAddress(base.clone()))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(ConsulError::BadAddress(base));
        }
        let wrong = |detail: &str| ConsulError::WrongScheme {
            address: base.clone(),
            detail: detail.to_owned(),
        };
        let builder = reqwest::Client::builder()
            .connect_timeout(config.timeout)
            .pool_idle_timeout(Duration::from_secs(30));
        let builder = match (url.scheme(), &config.tls) {
            ("https", Some(tls)) => builder
                .use_preconfigured_tls(tls.client_config().clone())
                .https_only(true),
            ("https", None) => return Err(wrong(
                "an https:// address needs consul.ca_file: the CA (PEM) that signed the agent's HTTPS certificate",
            )),
            (_, Some(_)) => return Err(wrong(
                "consul.ca_file is set but the address is http://: use https:// to reach the agent's HTTPS port (8501 by default), or leave the TLS keys empty",
            )),
            _ => builder,
        };
        let http = builder
            .build()
            .map_err(|e| ConsulError::BadAddress(format!("{base}: {e}")))?;
        Ok(Self {
            http,
            acl_token: config.acl_token.clone(),
            base,
            config,
            datacenter: None,
        })
    }

    /// The same agent and connections, every request sent with `?dc=dc`:
    /// reads and writes go to that Consul datacenter's servers and raft
    /// log (a session or lock there is that datacenter's). Agent endpoints
    /// stay the local agent's.
    pub fn in_datacenter(&self, dc: &str) -> Self {
        Self {
            datacenter: Some(dc.to_owned()),
            ..self.clone()
        }
    }

    /// The datacenter set with [`in_datacenter`](Self::in_datacenter).
    pub fn datacenter(&self) -> Option<&str> {
        self.datacenter.as_deref()
    }

    /// `GET /v1/agent/self`: the local agent's Consul datacenter and its
    /// `primary_datacenter` (empty when the agent does not report one).
    pub async fn agent_datacenters(&self) -> Result<AgentDatacenters, ConsulError> {
        const EP: &str = "agent/self";
        let r = self
            .call(Call::new(Method::GET, EP, "agent/self".into()))
            .await?;
        if r.status != StatusCode::OK {
            return Err(Self::unexpected(EP, &r));
        }
        let raw: types::RawAgentSelf = Self::decode(EP, &r.body)?;
        Ok(AgentDatacenters {
            datacenter: raw.config.datacenter,
            primary: raw.config.primary_datacenter.unwrap_or_default(),
        })
    }

    /// The agent address this client talks to.
    pub fn address(&self) -> &str {
        &self.base
    }

    async fn call(&self, c: Call<'_>) -> Result<Reply, ConsulError> {
        let Call {
            method,
            endpoint,
            path,
            query,
            body,
            safety,
            extra_timeout,
        } = c;
        let query = query.as_slice();
        let path = path.as_str();
        let mut attempt = 0;
        loop {
            let started = Instant::now();
            let result = self
                .call_once(&method, endpoint, path, query, body.clone(), extra_timeout)
                .await;
            let code = match &result {
                Ok(r) => r.status.as_u16().to_string(),
                Err(ConsulError::Unreachable { .. }) => "unreachable".into(),
                Err(ConsulError::Tls { .. } | ConsulError::WrongScheme { .. }) => "tls".into(),
                Err(ConsulError::PermissionDenied { .. }) => "403".into(),
                Err(ConsulError::Status { status, .. }) => status.to_string(),
                Err(_) => "error".into(),
            };
            metrics::histogram!(m::CONSUL_REQUEST_DURATION, "endpoint" => endpoint, "code" => code)
                .record(started.elapsed().as_secs_f64());
            match result {
                Err(e)
                    if e.is_retryable()
                        && safety == Safety::Idempotent
                        && attempt < self.config.retries =>
                {
                    metrics::counter!(m::CONSUL_ERRORS, "endpoint" => endpoint).increment(1);
                    attempt += 1;
                    let cap = self.config.backoff.saturating_mul(1 << attempt.min(10));
                    // (saturating: absurd settings cannot overflow)
                    let pause = cap.mul_f64(fastrand::f64());
                    tracing::debug!(endpoint, attempt, error = %e, pause_ms = pause.as_millis() as u64, "retrying Consul call");
                    tokio::time::sleep(pause).await;
                }
                Err(e) => {
                    metrics::counter!(m::CONSUL_ERRORS, "endpoint" => endpoint).increment(1);
                    return Err(e);
                }
                Ok(r) => return Ok(r),
            }
        }
    }

    async fn call_once(
        &self,
        method: &Method,
        endpoint: &'static str,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
        extra_timeout: Duration,
    ) -> Result<Reply, ConsulError> {
        let with_dc;
        let query = match &self.datacenter {
            Some(dc) if !endpoint.starts_with("agent/") => {
                with_dc = [query, &[("dc", dc.clone())]].concat();
                with_dc.as_slice()
            }
            _ => query,
        };
        let url = format!("{}/v1/{}{}", self.base, path, query_string(query));
        let mut req = self
            .http
            .request(method.clone(), url)
            .timeout(self.config.timeout.saturating_add(extra_timeout));
        if let Some(token) = &self.acl_token {
            req = req.header("X-Consul-Token", token);
        }
        if let Some(body) = body {
            req = req.body(body);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| self.send_error(endpoint, &e))?;
        let status = resp.status();
        let index = resp
            .headers()
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let body = resp.bytes().await.map_err(|e| ConsulError::Unreachable {
            address: self.base.clone(),
            endpoint,
            detail: transport_detail(&e),
            maybe_sent: true,
        })?;
        match status.as_u16() {
            400 if self.base.starts_with("http://")
                && String::from_utf8_lossy(&body).contains(tls::PLAINTEXT_TO_HTTPS) =>
            {
                Err(ConsulError::WrongScheme {
                    address: self.base.clone(),
                    detail: "the agent serves HTTPS on this port (it answered \"Client sent an HTTP request to an HTTPS server\"): use an https:// address and set consul.ca_file".into(),
                })
            }
            200 | 404 | 409 => Ok(Reply {
                status,
                index,
                body,
            }),
            403 => Err(ConsulError::PermissionDenied { endpoint }),
            other => Err(ConsulError::Status {
                endpoint,
                status: other,
                body: String::from_utf8_lossy(&body)
                    .trim()
                    .chars()
                    .take(500)
                    .collect(),
            }),
        }
    }

    /// A request that got no answer: a TLS failure (nothing was sent),
    /// an agent that does not speak the address's scheme, or a transport
    /// error.
    fn send_error(&self, endpoint: &'static str, e: &reqwest::Error) -> ConsulError {
        let https = self.base.starts_with("https://");
        let ca = self
            .config
            .tls
            .as_ref()
            .map(|t| t.files().ca_file.as_path());
        if let Some(detail) = tls::explain(e, https, ca) {
            return if detail == tls::NOT_TLS {
                ConsulError::WrongScheme {
                    address: self.base.clone(),
                    detail,
                }
            } else {
                ConsulError::Tls {
                    address: self.base.clone(),
                    endpoint,
                    detail,
                }
            };
        }
        let mut detail = transport_detail(e);
        let no_client_cert = self
            .config
            .tls
            .as_ref()
            .is_some_and(|t| t.files().cert_file.is_none());
        if https && no_client_cert {
            if let Some(hint) = tls::closed_without_client_cert_hint(&detail) {
                detail.push_str(hint);
            }
        }
        ConsulError::Unreachable {
            address: self.base.clone(),
            endpoint,
            detail,
            // Anything but a failed connect may have reached Consul.
            maybe_sent: !e.is_connect(),
        }
    }

    fn unexpected(endpoint: &'static str, reply: &Reply) -> ConsulError {
        ConsulError::Status {
            endpoint,
            status: reply.status.as_u16(),
            body: String::from_utf8_lossy(&reply.body)
                .trim()
                .chars()
                .take(500)
                .collect(),
        }
    }

    fn decode<T: serde::de::DeserializeOwned>(
        endpoint: &'static str,
        body: &[u8],
    ) -> Result<T, ConsulError> {
        serde_json::from_slice(body).map_err(|e| ConsulError::Decode {
            endpoint,
            detail: e.to_string(),
        })
    }

    fn json_body(
        endpoint: &'static str,
        value: &impl serde::Serialize,
    ) -> Result<Vec<u8>, ConsulError> {
        serde_json::to_vec(value).map_err(|e| ConsulError::Decode {
            endpoint,
            detail: e.to_string(),
        })
    }

    fn decode_bool(endpoint: &'static str, body: &[u8]) -> Result<bool, ConsulError> {
        match std::str::from_utf8(body).map(str::trim) {
            Ok("true") => Ok(true),
            Ok("false") => Ok(false),
            _ => Err(ConsulError::Decode {
                endpoint,
                detail: format!(
                    "expected true or false, got {:?}",
                    String::from_utf8_lossy(body)
                ),
            }),
        }
    }

    // ---- KV ---------------------------------------------------------------

    /// Reads one key; `None` if missing. Also returns `X-Consul-Index`.
    pub async fn kv_get(
        &self,
        key: &str,
        consistency: Consistency,
    ) -> Result<(Option<KvEntry>, u64), ConsulError> {
        self.kv_get_blocking(key, consistency, None).await
    }

    /// Reads one key, blocking until its index passes `wait.0` or `wait.1`
    /// elapses (Consul API, blocking queries). Index 0 never blocks.
    pub async fn kv_get_blocking(
        &self,
        key: &str,
        consistency: Consistency,
        wait: Option<(u64, Duration)>,
    ) -> Result<(Option<KvEntry>, u64), ConsulError> {
        const EP: &str = "kv/get";
        let mut query = consistency.query();
        let extra = blocking_query(&mut query, wait);
        let r = self
            .call(
                Call::new(Method::GET, EP, format!("kv/{key}"))
                    .query(query)
                    .extra_timeout(extra),
            )
            .await?;
        match r.status.as_u16() {
            404 => Ok((None, r.index)),
            200 => {
                let mut pairs: Vec<types::RawKv> = Self::decode(EP, &r.body)?;
                let entry = pairs.pop().map(|p| p.into_entry(EP)).transpose()?;
                Ok((entry, r.index))
            }
            _ => Err(Self::unexpected(EP, &r)),
        }
    }

    /// Lists every key under `prefix` (empty when none).
    pub async fn kv_list(
        &self,
        prefix: &str,
        consistency: Consistency,
    ) -> Result<Vec<KvEntry>, ConsulError> {
        Ok(self.kv_list_blocking(prefix, consistency, None).await?.0)
    }

    /// Lists every key under `prefix`, blocking until the prefix's index
    /// passes `wait.0` or `wait.1` elapses (as [`Self::kv_get_blocking`]);
    /// also returns `X-Consul-Index`, the index to wait on next.
    pub async fn kv_list_blocking(
        &self,
        prefix: &str,
        consistency: Consistency,
        wait: Option<(u64, Duration)>,
    ) -> Result<(Vec<KvEntry>, u64), ConsulError> {
        const EP: &str = "kv/list";
        let mut query = consistency.query();
        query.push(("recurse", String::new()));
        let extra = blocking_query(&mut query, wait);
        let r = self
            .call(
                Call::new(Method::GET, EP, format!("kv/{prefix}"))
                    .query(query)
                    .extra_timeout(extra),
            )
            .await?;
        match r.status.as_u16() {
            404 => Ok((Vec::new(), r.index)),
            200 => {
                let pairs: Vec<types::RawKv> = Self::decode(EP, &r.body)?;
                let entries = pairs
                    .into_iter()
                    .map(|p| p.into_entry(EP))
                    .collect::<Result<_, _>>()?;
                Ok((entries, r.index))
            }
            _ => Err(Self::unexpected(EP, &r)),
        }
    }

    /// Lists the names under `prefix` up to the first `separator` after
    /// it (Consul's `?keys&separator=`), and `X-Consul-Index`: for a
    /// prefix, the highest ModifyIndex under it (deleted keys' tombstones
    /// included), which a snapshot restore takes back.
    pub async fn kv_keys(
        &self,
        prefix: &str,
        separator: &str,
        consistency: Consistency,
    ) -> Result<(Vec<String>, u64), ConsulError> {
        const EP: &str = "kv/keys";
        let mut query = consistency.query();
        query.push(("keys", String::new()));
        query.push(("separator", separator.to_owned()));
        let r = self
            .call(Call::new(Method::GET, EP, format!("kv/{prefix}")).query(query))
            .await?;
        match r.status.as_u16() {
            404 => Ok((Vec::new(), r.index)),
            200 => Ok((Self::decode(EP, &r.body)?, r.index)),
            _ => Err(Self::unexpected(EP, &r)),
        }
    }

    /// Writes `value` to `key` as `how` says; `true` if applied. Sent once,
    /// whatever `how` is (see [`ConsulError::outcome_unknown`]).
    pub async fn kv_put(
        &self,
        key: &str,
        value: &[u8],
        how: KvWrite<'_>,
    ) -> Result<bool, ConsulError> {
        const EP: &str = "kv/put";
        let (query, safety) = match how {
            // Even a plain set is sent once: a retry after a late-applied
            // first attempt could overwrite a newer value.
            KvWrite::Set => (vec![], Safety::Once),
            KvWrite::Cas(index) => (vec![("cas", index.to_string())], Safety::Once),
            KvWrite::Acquire(session) => (vec![("acquire", session.to_owned())], Safety::Once),
            KvWrite::Release(session) => (vec![("release", session.to_owned())], Safety::Once),
        };
        let r = self
            .call(
                Call::new(Method::PUT, EP, format!("kv/{key}"))
                    .query(query)
                    .body(value.to_vec())
                    .safety(safety),
            )
            .await?;
        if r.status != StatusCode::OK {
            return Err(Self::unexpected(EP, &r));
        }
        Self::decode_bool(EP, &r.body)
    }

    /// Deletes `key` (only if its ModifyIndex is `cas`, when given).
    pub async fn kv_delete(&self, key: &str, cas: Option<u64>) -> Result<bool, ConsulError> {
        const EP: &str = "kv/delete";
        let (query, safety) = match cas {
            Some(i) => (vec![("cas", i.to_string())], Safety::Once),
            None => (vec![], Safety::Once),
        };
        let r = self
            .call(
                Call::new(Method::DELETE, EP, format!("kv/{key}"))
                    .query(query)
                    .safety(safety),
            )
            .await?;
        if r.status != StatusCode::OK {
            return Err(Self::unexpected(EP, &r));
        }
        Self::decode_bool(EP, &r.body)
    }

    // ---- Sessions ---------------------------------------------------------

    /// Creates a session and returns its id.
    pub async fn session_create(&self, spec: &SessionSpec) -> Result<String, ConsulError> {
        const EP: &str = "session/create";
        let body = Self::json_body(EP, &spec.to_json())?;
        // Not idempotent (each call makes a session), but an unknown outcome
        // only leaks a session that expires by itself: sent once anyway.
        let r = self
            .call(
                Call::new(Method::PUT, EP, "session/create".into())
                    .body(body)
                    .once(),
            )
            .await?;
        if r.status != StatusCode::OK {
            return Err(Self::unexpected(EP, &r));
        }
        let v: types::CreatedId = Self::decode(EP, &r.body)?;
        Ok(v.id)
    }

    /// Renews a session. `Ok(None)` means Consul no longer knows it: every
    /// lock it held is lost. `Ok(Some(info))` carries the TTL Consul now
    /// applies (it may be larger than asked; use it).
    pub async fn session_renew(&self, id: &str) -> Result<Option<SessionInfo>, ConsulError> {
        const EP: &str = "session/renew";
        let r = self
            .call(Call::new(Method::PUT, EP, format!("session/renew/{id}")))
            .await?;
        Self::session_reply(EP, &r)
    }

    /// Destroys a session (idempotent). Release held keys first, or
    /// lock-delay applies to them.
    pub async fn session_destroy(&self, id: &str) -> Result<(), ConsulError> {
        const EP: &str = "session/destroy";
        let r = self
            .call(Call::new(Method::PUT, EP, format!("session/destroy/{id}")))
            .await?;
        if r.status != StatusCode::OK {
            return Err(Self::unexpected(EP, &r));
        }
        Ok(())
    }

    /// A session's current state, or `None` if it does not exist.
    pub async fn session_info(&self, id: &str) -> Result<Option<SessionInfo>, ConsulError> {
        const EP: &str = "session/info";
        let r = self
            .call(
                Call::new(Method::GET, EP, format!("session/info/{id}"))
                    .query(Consistency::Consistent.query()),
            )
            .await?;
        Self::session_reply(EP, &r)
    }

    /// `[session]` on 200, `None` on 404 (the session does not exist).
    fn session_reply(
        endpoint: &'static str,
        r: &Reply,
    ) -> Result<Option<SessionInfo>, ConsulError> {
        match r.status.as_u16() {
            404 => Ok(None),
            200 => {
                let mut v: Vec<types::RawSession> = Self::decode(endpoint, &r.body)?;
                Ok(v.pop().map(types::RawSession::into_info))
            }
            _ => Err(Self::unexpected(endpoint, r)),
        }
    }

    // ---- Transactions -----------------------------------------------------

    /// Runs KV operations all-or-nothing. Sent once: a transport failure or
    /// 5xx leaves the outcome unknown ([`ConsulError::outcome_unknown`]).
    pub async fn txn(&self, ops: &[TxnOp]) -> Result<TxnOutcome, ConsulError> {
        const EP: &str = "txn";
        if ops.is_empty() || ops.len() > 64 {
            return Err(ConsulError::Decode {
                endpoint: EP,
                detail: format!("a txn takes 1 to 64 operations, got {}", ops.len()),
            });
        }
        let body: Vec<serde_json::Value> = ops.iter().map(TxnOp::to_json).collect();
        let body = Self::json_body(EP, &body)?;
        let r = self
            .call(Call::new(Method::PUT, EP, "txn".into()).body(body).once())
            .await?;
        let raw: types::RawTxnReply = match r.status.as_u16() {
            200 | 409 => Self::decode(EP, &r.body)?,
            _ => return Err(Self::unexpected(EP, &r)),
        };
        if r.status == StatusCode::OK {
            let results = raw
                .results
                .unwrap_or_default()
                .into_iter()
                .filter_map(|res| res.kv)
                .map(|kv| kv.into_entry(EP))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(TxnOutcome::Committed(results))
        } else {
            let errors = raw
                .errors
                .unwrap_or_default()
                .into_iter()
                .map(|e| TxnError {
                    op_index: e.op_index,
                    what: e.what,
                })
                .collect();
            Ok(TxnOutcome::RolledBack(errors))
        }
    }

    // ---- Agent ------------------------------------------------------------

    /// Registers (or re-registers) a service with the local agent.
    pub async fn service_register(&self, reg: &ServiceRegistration) -> Result<(), ConsulError> {
        const EP: &str = "agent/service/register";
        let body = Self::json_body(EP, &reg.to_json())?;
        let r = self
            .call(Call::new(Method::PUT, EP, "agent/service/register".into()).body(body))
            .await?;
        if r.status != StatusCode::OK {
            return Err(Self::unexpected(EP, &r));
        }
        Ok(())
    }

    /// Deregisters a service from the local agent.
    pub async fn service_deregister(&self, service_id: &str) -> Result<(), ConsulError> {
        const EP: &str = "agent/service/deregister";
        let r = self
            .call(Call::new(
                Method::PUT,
                EP,
                format!("agent/service/deregister/{service_id}"),
            ))
            .await?;
        if r.status != StatusCode::OK {
            return Err(Self::unexpected(EP, &r));
        }
        Ok(())
    }

    /// Sets a TTL check to `status` (`passing`, `warning`, `critical`).
    /// [`ConsulError::UnknownCheck`] means the agent lost it: register again.
    pub async fn check_update(
        &self,
        check_id: &str,
        status: &str,
        output: &str,
    ) -> Result<(), ConsulError> {
        const EP: &str = "agent/check/update";
        let body = Self::json_body(EP, &serde_json::json!({"Status": status, "Output": output}))?;
        let r = self
            .call(Call::new(Method::PUT, EP, format!("agent/check/update/{check_id}")).body(body))
            .await;
        match r {
            Ok(r) if r.status == StatusCode::OK => Ok(()),
            Ok(r) if r.status == StatusCode::NOT_FOUND => Err(ConsulError::UnknownCheck {
                check_id: check_id.to_owned(),
            }),
            Ok(r) => Err(Self::unexpected(EP, &r)),
            Err(ConsulError::Status { body, .. })
                if body.contains("does not have associated TTL") =>
            {
                Err(ConsulError::UnknownCheck {
                    check_id: check_id.to_owned(),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// The ids of the services registered with this agent (`GET
    /// /agent/services`): answered by the agent from its own state, so a
    /// node checking its own registration costs the Consul servers nothing
    /// however many nodes there are.
    pub async fn agent_service_ids(&self) -> Result<Vec<String>, ConsulError> {
        const EP: &str = "agent/services";
        let r = self
            .call(Call::new(Method::GET, EP, "agent/services".to_owned()))
            .await?;
        if r.status != StatusCode::OK {
            return Err(Self::unexpected(EP, &r));
        }
        let services: serde_json::Map<String, serde_json::Value> = Self::decode(EP, &r.body)?;
        Ok(services.into_iter().map(|(id, _)| id).collect())
    }

    // ---- Discovery --------------------------------------------------------

    /// Instances of service `name`; only those whose checks all pass when
    /// `passing_only`. An empty service address is replaced by the node's.
    pub async fn health_service(
        &self,
        name: &str,
        passing_only: bool,
    ) -> Result<Vec<ServiceEntry>, ConsulError> {
        const EP: &str = "health/service";
        let mut query = vec![];
        if passing_only {
            // Consul: leave `passing` out rather than sending passing=false.
            query.push(("passing", String::new()));
        }
        let r = self
            .call(Call::new(Method::GET, EP, format!("health/service/{name}")).query(query))
            .await?;
        if r.status != StatusCode::OK {
            return Err(Self::unexpected(EP, &r));
        }
        let raw: Vec<types::RawHealthEntry> = Self::decode(EP, &r.body)?;
        Ok(raw
            .into_iter()
            .map(types::RawHealthEntry::into_entry)
            .collect())
    }
}

/// `?a=1&flag`: an empty value is sent as a bare flag (`?consistent`,
/// `?recurse`, `?passing`), the form Consul documents.
fn query_string(query: &[(&str, String)]) -> String {
    let mut out = String::new();
    for (i, (key, value)) in query.iter().enumerate() {
        out.push(if i == 0 { '?' } else { '&' });
        out.push_str(key);
        if !value.is_empty() {
            out.push('=');
            out.extend(url::form_urlencoded::byte_serialize(value.as_bytes()));
        }
    }
    out
}

fn transport_detail(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "connection refused or unreachable".into()
    } else {
        // reqwest errors carry the URL, which never holds the token here;
        // the cause is further down the chain.
        tls::transport_text(e)
    }
}

/// Adds `index` and `wait` to a read's query when `wait` asks to block
/// (index 0 never blocks); returns how much longer than a plain read the
/// call may take.
fn blocking_query(
    query: &mut Vec<(&'static str, String)>,
    wait: Option<(u64, Duration)>,
) -> Duration {
    let Some((index, wait)) = wait.filter(|(i, _)| *i > 0) else {
        return Duration::ZERO;
    };
    // Whole seconds, 1 s to 10 min: the documented form.
    let wait = Duration::from_secs(wait.as_secs().clamp(1, 600));
    query.push(("index", index.to_string()));
    query.push(("wait", format!("{}s", wait.as_secs())));
    // The server adds up to wait/16 of jitter.
    wait + wait / 16 + Duration::from_secs(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_bare_and_values_are_encoded() {
        let q = [
            ("consistent", String::new()),
            ("index", "5".to_owned()),
            ("acquire", "a b&c".to_owned()),
        ];
        assert_eq!(query_string(&q), "?consistent&index=5&acquire=a+b%26c");
        assert_eq!(query_string(&[]), "");
    }
}
