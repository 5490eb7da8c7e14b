//! Where the nodes come from: a static list, or Consul's health API
//! watched with blocking queries, over HTTP or HTTPS ([`ConsulTls`]).

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::{ClientConfig, DigitallySignedStruct};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use serde::Deserialize;

use crate::consul_env::ConsulEnv;
use crate::metrics as m;
use crate::nodes::NodeSet;
use crate::pem;

/// How to find idgen nodes in Consul. Its `Debug` form shows whether a
/// token is set, never the token.
#[derive(Clone)]
pub struct ConsulDiscovery {
    /// The agent's HTTP address, e.g. `http://127.0.0.1:8500`.
    pub address: String,
    /// The service name idgen registers under (default `idgen`).
    pub service: String,
    /// An ACL token with `service:read` (sent as `X-Consul-Token`).
    pub token: Option<String>,
    /// Ask another datacenter's servers (`?dc=`).
    pub datacenter: Option<String>,
    /// Consul datacenters to take nodes from, in this order, while the
    /// local one (or [`datacenter`](Self::datacenter)) lists no passing
    /// node (empty: never leave it). See
    /// [`ConsulDiscovery::fallback_datacenters`].
    pub fallback_datacenters: Vec<String>,
    /// Whether strict, segment, lease and formatted calls may go to a
    /// fallback datacenter's nodes (default `false`). See
    /// [`ConsulDiscovery::counters_may_cross_datacenters`].
    pub counters_may_cross_datacenters: bool,
    /// While the nodes in use are a fallback datacenter's, how long one
    /// blocking query on the local datacenter waits before the fallback
    /// datacenters are read again (default 5 s; the local datacenter's
    /// return is seen at once either way).
    pub fallback_recheck: Duration,
    /// Only instances carrying this tag (`?tag=`): nodes register the
    /// modes they serve (`snowflake`, `segment`, `lease`, `strict`,
    /// `formatted`) and `dc-<n>`.
    pub tag: Option<String>,
    /// How long one blocking query waits for a change (default 30 s,
    /// Consul caps it at 10 min).
    pub wait: Duration,
    /// Least time between two queries, so a query that returns at once
    /// cannot turn the watch into a busy loop (default 100 ms).
    pub min_interval: Duration,
    /// Pause after a failed query before trying again (default 1 s).
    pub retry_after: Duration,
    /// HTTPS settings for an `https://` address; when not set, they come
    /// from [`ConsulDiscovery::env`] (`CONSUL_CACERT` and the rest).
    pub tls: Option<ConsulTls>,
    /// Consul's environment variables, read when this value was made
    /// ([`ConsulDiscovery::new`] and [`ConsulDiscovery::from_env`] read the
    /// process environment): they fill in the token and the HTTPS settings
    /// not set explicitly. Replace with [`ConsulDiscovery::env`].
    pub env: ConsulEnv,
}

impl fmt::Debug for ConsulDiscovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a secret: shown only as set or not (as ConsulEnv does).
        f.debug_struct("ConsulDiscovery")
            .field("address", &self.address)
            .field("service", &self.service)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("datacenter", &self.datacenter)
            .field("fallback_datacenters", &self.fallback_datacenters)
            .field(
                "counters_may_cross_datacenters",
                &self.counters_may_cross_datacenters,
            )
            .field("fallback_recheck", &self.fallback_recheck)
            .field("tag", &self.tag)
            .field("wait", &self.wait)
            .field("min_interval", &self.min_interval)
            .field("retry_after", &self.retry_after)
            .field("tls", &self.tls)
            .field("env", &self.env)
            .finish()
    }
}

impl ConsulDiscovery {
    /// Discovery of service `idgen` through the agent at `address`
    /// (explicit: `CONSUL_HTTP_ADDR` is not consulted). The token and the
    /// HTTPS settings still come from Consul's environment variables when
    /// not set here (see [`ConsulEnv`]).
    pub fn new(address: impl Into<String>) -> Self {
        Self::with_env(address.into(), ConsulEnv::from_env())
    }

    /// Discovery of service `idgen` configured the consul CLI's way:
    /// the agent at `CONSUL_HTTP_ADDR` (default `http://127.0.0.1:8500`),
    /// with `CONSUL_HTTP_TOKEN`/`_FILE`, `CONSUL_CACERT`,
    /// `CONSUL_CLIENT_CERT`/`_KEY`, `CONSUL_TLS_SERVER_NAME` and
    /// `CONSUL_HTTP_SSL_VERIFY`. Builder methods called afterwards win.
    pub fn from_env() -> Result<Self, String> {
        Self::from_consul_env(ConsulEnv::from_env())
    }

    /// As [`ConsulDiscovery::from_env`], from the variables in `env`.
    pub fn from_consul_env(env: ConsulEnv) -> Result<Self, String> {
        Ok(Self::with_env(env.address()?, env))
    }

    fn with_env(address: String, env: ConsulEnv) -> Self {
        Self {
            address,
            service: "idgen".into(),
            token: None,
            datacenter: None,
            fallback_datacenters: Vec::new(),
            counters_may_cross_datacenters: false,
            fallback_recheck: Duration::from_secs(5),
            tag: None,
            wait: Duration::from_secs(30),
            min_interval: Duration::from_millis(100),
            retry_after: Duration::from_secs(1),
            tls: None,
            env,
        }
    }

    /// Replaces the Consul environment the token and HTTPS settings fall
    /// back to (`ConsulEnv::default()`: none).
    pub fn env(mut self, env: ConsulEnv) -> Self {
        self.env = env;
        self
    }

    /// Reaches the agent over HTTPS with `tls` (the address must be
    /// `https://`).
    pub fn tls(mut self, tls: ConsulTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets the service name.
    pub fn service(mut self, service: impl Into<String>) -> Self {
        self.service = service.into();
        self
    }

    /// Sets the ACL token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Sets the datacenter.
    pub fn datacenter(mut self, dc: impl Into<String>) -> Self {
        self.datacenter = Some(dc.into());
        self
    }

    /// Other Consul datacenters to take nodes from, first one first,
    /// while the local datacenter (or [`datacenter`](Self::datacenter))
    /// lists no passing idgen node: the client then uses the first of
    /// them that lists one (`?dc=`), and goes back to the local
    /// datacenter as soon as it lists a passing node again. Each switch is
    /// logged at WARN and shown by the `idgen_client_datacenter_fallback`
    /// gauge.
    ///
    /// Snowflake IDs and UUIDs go to whichever datacenter's nodes are in
    /// use, with no error: they stay unique because the datacenter id is
    /// part of each of them and every Consul datacenter's nodes own a
    /// different `node.datacenter_id`, claimed once in the primary
    /// datacenter (safety rule 39). Strict, segment, lease and formatted
    /// values do not cross: see
    /// [`counters_may_cross_datacenters`](Self::counters_may_cross_datacenters).
    ///
    /// Named "fallback", not "failover", because the client's failover is
    /// already the move from one node to another inside the node set.
    pub fn fallback_datacenters<S: Into<String>>(
        mut self,
        datacenters: impl IntoIterator<Item = S>,
    ) -> Self {
        self.fallback_datacenters = datacenters.into_iter().map(Into::into).collect();
        self
    }

    /// Lets strict, segment, lease and formatted calls go to a fallback
    /// datacenter's nodes (default: refused). Their values come from
    /// counters (a strict key's, a segment tag's, a lease token's, a
    /// format's) kept in one cluster's Consul KV, and Consul datacenters
    /// do not share KV: a value from another datacenter's counter carries
    /// no datacenter id and can equal one the local cluster issued, or
    /// will issue. Without this opt-in such a call, while a fallback
    /// datacenter's nodes are in use, fails with
    /// [`Error::CrossesDatacenters`](crate::Error::CrossesDatacenters)
    /// and reaches no node. Opt in only when each datacenter's strict
    /// keys, segment tags, lease zones and formats are its own.
    pub fn counters_may_cross_datacenters(mut self, allowed: bool) -> Self {
        self.counters_may_cross_datacenters = allowed;
        self
    }

    /// Sets how often the fallback datacenters are read again while one
    /// of them is in use (see [`fallback_recheck`](Self::fallback_recheck)).
    pub fn fallback_recheck(mut self, every: Duration) -> Self {
        self.fallback_recheck = every;
        self
    }

    /// Keeps only instances with this tag, e.g. `strict` for the nodes
    /// whose config enables strict mode.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    /// Sets the blocking-query wait.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
}

#[derive(Deserialize)]
struct HealthEntry {
    #[serde(rename = "Node")]
    node: NodeEntry,
    #[serde(rename = "Service")]
    service: ServiceEntry,
}

#[derive(Deserialize)]
struct NodeEntry {
    #[serde(rename = "Address", default)]
    address: String,
}

#[derive(Deserialize)]
struct ServiceEntry {
    #[serde(rename = "Address", default)]
    address: String,
    #[serde(rename = "Port")]
    port: u16,
}

/// One round's answer.
struct Answer {
    addrs: Vec<String>,
    index: u64,
}

/// Watches Consul and keeps a [`NodeSet`] current.
pub(crate) struct ConsulWatch {
    config: ConsulDiscovery,
    /// The token sent: the explicit one, else the environment's.
    token: Option<String>,
    /// A client certificate is presented.
    identity: bool,
    http: reqwest::Client,
}

impl ConsulWatch {
    pub(crate) fn new(config: ConsulDiscovery) -> Result<Self, String> {
        if config.service.is_empty() {
            return Err("the Consul service name is empty".into());
        }
        if !config.address.starts_with("http://") && !config.address.starts_with("https://") {
            return Err(format!(
                "the Consul address {:?} must start with http:// or https://",
                config.address
            ));
        }
        if config.wait > Duration::from_secs(600) {
            return Err("the blocking-query wait is at most 10 minutes (Consul's limit)".into());
        }
        if config.fallback_recheck.is_zero() {
            return Err("the fallback recheck period must be above zero".into());
        }
        if let Some(dc) = config.fallback_datacenters.iter().find(|d| d.is_empty()) {
            return Err(format!(
                "a fallback datacenter name is empty ({dc:?}): name each Consul datacenter"
            ));
        }
        let builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(2));
        let https = config.address.starts_with("https://");
        // Explicit settings first, then Consul's variables (which, as in
        // Consul, an http:// address ignores).
        let tls = match (&config.tls, https) {
            (Some(tls), true) => Some(tls.clone()),
            (None, true) => Some(config.env.tls().map_err(|e| {
                format!("the Consul address {:?} is https://: {e}", config.address)
            })?),
            (Some(_), false) => {
                return Err(format!(
                    "TLS settings are given but the Consul address {:?} is plaintext http://: use https:// (the agent's HTTPS port, 8501 by default)",
                    config.address
                ))
            }
            (None, false) => None,
        };
        let identity = tls.as_ref().is_some_and(|t| t.identity);
        let builder = match tls {
            Some(tls) => builder
                .use_preconfigured_tls((*tls.config).clone())
                .https_only(true),
            None => builder,
        };
        let token = match &config.token {
            Some(t) => Some(t.clone()),
            None => config.env.acl_token()?,
        };
        let http = builder
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self {
            config,
            token,
            identity,
            http,
        })
    }

    /// One query of the local datacenter (or the configured one),
    /// blocking on `index` when it is not 0 for at most `wait`.
    async fn query(&self, index: u64, wait: Duration) -> Result<Answer, String> {
        self.query_dc(self.config.datacenter.as_deref(), index, wait)
            .await
    }

    /// One query: `/v1/health/service/<service>?passing` of datacenter
    /// `dc` (the agent's own with `None`), blocking on `index` when it is
    /// not 0 for at most `wait`.
    async fn query_dc(
        &self,
        dc: Option<&str>,
        index: u64,
        wait: Duration,
    ) -> Result<Answer, String> {
        let c = &self.config;
        let mut url = format!(
            "{}/v1/health/service/{}?passing",
            c.address.trim_end_matches('/'),
            encode(&c.service)
        );
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(dc) = dc {
            query.push(("dc", dc.to_owned()));
        }
        if let Some(tag) = &c.tag {
            query.push(("tag", tag.clone()));
        }
        // Never block on index 0 (Consul rule): the first query answers at once.
        let mut timeout = Duration::from_secs(5);
        if index > 0 {
            query.push(("index", index.to_string()));
            query.push(("wait", format!("{}ms", wait.as_millis())));
            // Consul adds up to wait/16 of jitter.
            timeout += wait + wait / 16;
        }
        for (k, v) in &query {
            url.push('&');
            url.push_str(k);
            url.push('=');
            url.push_str(&encode(v));
        }
        let mut req = self.http.get(&url).timeout(timeout);
        if let Some(token) = &self.token {
            req = req.header("X-Consul-Token", token);
        }
        let https = c.address.starts_with("https://");
        let resp = req
            .send()
            .await
            .map_err(|e| send_error(&e, https && !self.identity))?;
        let status = resp.status();
        let next = resp
            .headers()
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(self.refusal(status, body.trim()));
        }
        let entries: Vec<HealthEntry> = resp
            .json()
            .await
            .map_err(|e| format!("unreadable health answer: {e}"))?;
        let addrs = entries
            .into_iter()
            .map(|e| {
                let host = if e.service.address.is_empty() {
                    e.node.address
                } else {
                    e.service.address
                };
                if host.contains(':') {
                    format!("[{host}]:{}", e.service.port)
                } else {
                    format!("{host}:{}", e.service.port)
                }
            })
            .collect();
        Ok(Answer { addrs, index: next })
    }

    /// An answer other than 2xx in words: what to change.
    fn refusal(&self, status: reqwest::StatusCode, body: &str) -> String {
        let c = &self.config;
        if status.as_u16() == 400 && body.contains(PLAINTEXT_TO_HTTPS) {
            return format!(
                "Consul at {} serves HTTPS on this port: use an https:// address with a CA (--consul-ca or CONSUL_CACERT)",
                c.address
            );
        }
        if status.as_u16() == 403 {
            let whose = if self.token.is_some() {
                "the token given has no service:read on it"
            } else {
                "no ACL token was sent: set CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE (or ConsulDiscovery::token)"
            };
            return format!(
                "Consul refused to list service {:?} (HTTP 403 {body}): {whose}",
                c.service
            );
        }
        format!("HTTP {status}: {body}")
    }

    /// The first round, at start-up: the client does not start without
    /// knowing at least the answer. With fallback datacenters, it also
    /// learns the local datacenter's name (for the words of a refusal) and
    /// starts on a fallback datacenter's nodes when the local one lists
    /// none.
    pub(crate) async fn first(&self, nodes: &NodeSet) -> Result<u64, String> {
        let answer = self.query(0, self.config.wait).await?;
        if !self.config.fallback_datacenters.is_empty() {
            nodes.set_local_datacenter(self.local_name().await);
        }
        metrics::gauge!(m::DATACENTER_FALLBACK).set(0.0);
        if answer.addrs.is_empty() && self.fall_back(nodes).await {
            // Started on a fallback datacenter's nodes.
        } else {
            nodes.replace(&answer.addrs)?;
        }
        metrics::gauge!(m::CONSUL_REACHABLE).set(1.0);
        metrics::gauge!(m::DISCOVERY_AGE).set(0.0);
        Ok(answer.index)
    }

    /// Refuses, at start-up (a configuration error), a fallback datacenter
    /// the agent does not know
    /// (`/v1/catalog/datacenters`, which needs no ACL), so a misspelt name
    /// fails here with the names there are instead of leaving the client
    /// without nodes when the local datacenter has none. An agent that
    /// does not answer the listing is not a reason to refuse: the watch
    /// reads each fallback anyway.
    pub(crate) async fn check_fallback_names(&self) -> Result<(), String> {
        if self.config.fallback_datacenters.is_empty() {
            return Ok(());
        }
        let url = format!(
            "{}/v1/catalog/datacenters",
            self.config.address.trim_end_matches('/')
        );
        let mut req = self.http.get(&url).timeout(Duration::from_secs(5));
        if let Some(token) = &self.token {
            req = req.header("X-Consul-Token", token);
        }
        let known: Vec<String> = match req.send().await {
            Ok(resp) if resp.status().is_success() => match resp.json().await {
                Ok(names) => names,
                Err(_) => return Ok(()),
            },
            _ => return Ok(()),
        };
        unknown_fallbacks(&self.config.fallback_datacenters, &known)
    }

    /// The name of the datacenter the watch asks first: the configured
    /// one, else the agent's own (`/v1/agent/self`, which needs
    /// `agent:read`; without it, the words "the agent's own").
    async fn local_name(&self) -> String {
        if let Some(dc) = &self.config.datacenter {
            return dc.clone();
        }
        #[derive(Deserialize)]
        struct AgentSelf {
            #[serde(rename = "Config")]
            config: AgentConfig,
        }
        #[derive(Deserialize)]
        struct AgentConfig {
            #[serde(rename = "Datacenter")]
            datacenter: String,
        }
        let url = format!(
            "{}/v1/agent/self",
            self.config.address.trim_end_matches('/')
        );
        let mut req = self.http.get(&url).timeout(Duration::from_secs(5));
        if let Some(token) = &self.token {
            req = req.header("X-Consul-Token", token);
        }
        let name = match req.send().await {
            Ok(resp) if resp.status().is_success() => resp
                .json::<AgentSelf>()
                .await
                .ok()
                .map(|a| a.config.datacenter),
            _ => None,
        };
        name.filter(|n| !n.is_empty())
            .unwrap_or_else(|| "the agent's own".into())
    }

    /// While the local datacenter lists no passing node: puts the first
    /// fallback datacenter that lists one in use (a WARN line when that
    /// changes the datacenter in use). False when none lists a node (the
    /// nodes in use stay as they were).
    async fn fall_back(&self, set: &NodeSet) -> bool {
        for dc in &self.config.fallback_datacenters {
            let addrs = match self.query_dc(Some(dc), 0, self.config.wait).await {
                Ok(answer) => answer.addrs,
                Err(e) => {
                    tracing::debug!(datacenter = %dc, error = %e, "fallback datacenter not readable");
                    continue;
                }
            };
            if addrs.is_empty() {
                continue;
            }
            let before = set.fallback();
            if let Err(e) = set.replace_from(&addrs, Some(dc)) {
                tracing::warn!(datacenter = %dc, error = %e, "Consul listed an unusable address");
                continue;
            }
            if before.as_deref() != Some(dc.as_str()) {
                tracing::warn!(
                    local = %set.local_datacenter(),
                    datacenter = %dc,
                    nodes = ?addrs,
                    "the local Consul datacenter lists no passing idgen node: using fallback datacenter {dc:?} (snowflake and UUID calls only, unless counters_may_cross_datacenters)"
                );
            }
            metrics::gauge!(m::DATACENTER_FALLBACK).set(1.0);
            return true;
        }
        false
    }

    /// Takes the local datacenter's answer: its nodes when it lists any
    /// (back from a fallback datacenter, with a WARN line, if one was in
    /// use), else a fallback datacenter's, else the last known nodes.
    async fn take(&self, set: &NodeSet, addrs: &[String]) {
        if addrs.is_empty() {
            if self.fall_back(set).await {
                return;
            }
            if set.len() > 0 {
                tracing::warn!(service = %self.config.service, "Consul lists no passing idgen instance: keeping the last known nodes");
                return;
            }
        }
        if let Some(dc) = set.fallback() {
            tracing::warn!(
                local = %set.local_datacenter(),
                fallback = %dc,
                nodes = ?addrs,
                "the local Consul datacenter lists passing idgen nodes again: back from fallback datacenter {dc:?}"
            );
        }
        match set.replace(addrs) {
            Ok(()) => metrics::gauge!(m::DATACENTER_FALLBACK).set(0.0),
            Err(e) => tracing::warn!(error = %e, "Consul listed an unusable address"),
        }
    }

    /// Watches until the node set is dropped. When Consul cannot be
    /// reached the last known set stays in use; a log line and the
    /// `idgen_client_consul_reachable` gauge say so. While a fallback
    /// datacenter's nodes are in use, each blocking query on the local
    /// datacenter waits at most `fallback_recheck`, so the fallback
    /// datacenters are read again that often, and the local one's return
    /// ends the query at once.
    pub(crate) async fn run(self, nodes: std::sync::Weak<NodeSet>, mut index: u64) {
        let mut last_ok = Instant::now();
        let mut down = false;
        let mut wait = self.config.wait;
        loop {
            let started = Instant::now();
            let result = self.query(index, wait).await;
            let Some(set) = nodes.upgrade() else { return };
            match result {
                Ok(answer) => {
                    if down {
                        tracing::info!(consul = %self.config.address, "Consul reachable again: node list current");
                        down = false;
                    }
                    metrics::gauge!(m::CONSUL_REACHABLE).set(1.0);
                    last_ok = Instant::now();
                    // An index that went backwards (Consul restored a
                    // snapshot) restarts the watch.
                    index = if answer.index < index {
                        0
                    } else {
                        answer.index
                    };
                    self.take(&set, &answer.addrs).await;
                }
                Err(e) => {
                    metrics::counter!(m::DISCOVERY_ERRORS).increment(1);
                    metrics::gauge!(m::CONSUL_REACHABLE).set(0.0);
                    if !down {
                        tracing::warn!(consul = %self.config.address, error = %e, nodes = set.len(), "Consul unreachable: keeping the last known idgen nodes");
                        down = true;
                    }
                    index = 0;
                }
            }
            wait = if set.fallback().is_some() {
                self.config.wait.min(self.config.fallback_recheck)
            } else {
                self.config.wait
            };
            metrics::gauge!(m::DISCOVERY_AGE).set(last_ok.elapsed().as_secs_f64());
            drop(set);
            let pause = if down {
                self.config.retry_after.mul_f64(0.5 + fastrand::f64())
            } else {
                self.config.min_interval.saturating_sub(started.elapsed())
            };
            tokio::time::sleep(pause).await;
        }
    }
}

/// The refusal for fallback datacenters not in `known` (the agent's
/// `/v1/catalog/datacenters`), if any.
fn unknown_fallbacks(fallbacks: &[String], known: &[String]) -> Result<(), String> {
    let unknown: Vec<&String> = fallbacks.iter().filter(|f| !known.contains(f)).collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(format!(
        "fallback datacenter(s) {unknown:?} unknown to the Consul agent, which knows {known:?}: name Consul datacenters (case matters)"
    ))
}

/// Percent-encodes a query value.
fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Go's HTTP server answers this (status 400) to a plaintext request on
/// an HTTPS port, as a Consul agent with TLS does.
const PLAINTEXT_TO_HTTPS: &str = "Client sent an HTTP request to an HTTPS server";

/// HTTPS to the Consul agent: the CA that signed its certificate, a
/// client certificate for an agent with `verify_incoming`, and the name to
/// verify when it is not the address's host. rustls with ring.
#[derive(Clone)]
pub struct ConsulTls {
    config: Arc<ClientConfig>,
    /// A client certificate is presented.
    identity: bool,
}

impl fmt::Debug for ConsulTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulTls").finish_non_exhaustive()
    }
}

impl ConsulTls {
    /// From PEM text: `ca` (one or more CA certificates), an optional
    /// client `(certificate chain, private key)`, and an optional server
    /// name that the agent's certificate must carry instead of the
    /// address's host (`CONSUL_TLS_SERVER_NAME`).
    pub fn from_pem(
        ca: &[u8],
        client: Option<(&[u8], &[u8])>,
        server_name: Option<&str>,
    ) -> Result<Self, String> {
        let roots = pem::ca_roots(ca).map_err(|e| format!("CA: {e}"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| format!("CA: {e}"))?;
        let name = match server_name {
            Some(name) => Some(
                ServerName::try_from(name.to_owned())
                    .map_err(|e| format!("TLS server name {name:?}: {e}"))?,
            ),
            None => None,
        };
        let identity = match client {
            Some((cert, key)) => Some((
                pem::certificates(cert).map_err(|e| format!("client certificate: {e}"))?,
                pem::private_key(key).map_err(|e| format!("client key: {e}"))?,
            )),
            None => None,
        };
        Self::build(provider, Some(webpki), name, identity)
    }

    /// From PEM files; every error names the file.
    pub fn from_files(
        ca: &Path,
        client: Option<(&Path, &Path)>,
        server_name: Option<&str>,
    ) -> Result<Self, String> {
        let ca_pem = read(ca)?;
        let client_pem = match client {
            Some((c, k)) => Some((read(c)?, read(k)?)),
            None => None,
        };
        Self::from_pem(
            &ca_pem,
            client_pem
                .as_ref()
                .map(|(c, k)| (c.as_slice(), k.as_slice())),
            server_name,
        )
        .map_err(|e| match client {
            Some((c, k)) => format!(
                "{e} (CA {}, certificate {}, key {})",
                ca.display(),
                c.display(),
                k.display()
            ),
            None => format!("{e} (CA {})", ca.display()),
        })
    }

    /// HTTPS that does NOT check the agent's certificate
    /// (`CONSUL_HTTP_SSL_VERIFY=false`): the connection is encrypted, but
    /// anyone on the path can answer as the agent. An optional client
    /// certificate and key (PEM files) are still presented.
    pub fn unverified(client: Option<(&Path, &Path)>) -> Result<Self, String> {
        let identity = match client {
            Some((cert, key)) => Some((
                pem::read_certificates(cert)
                    .map_err(|e| format!("client certificate {}: {e}", cert.display()))?,
                pem::read_private_key(key)
                    .map_err(|e| format!("client key {}: {e}", key.display()))?,
            )),
            None => None,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Self::build(provider, None, None, identity)
    }

    /// The rustls client configuration both constructors end in: the
    /// agent's certificate checked by `chain` (any certificate when
    /// `None`) against `name` (else the address's host), and the client
    /// certificate chain and key when given. HTTP/1.1 only.
    fn build(
        provider: Arc<rustls::crypto::CryptoProvider>,
        chain: Option<Arc<WebPkiServerVerifier>>,
        name: Option<ServerName<'static>>,
        identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    ) -> Result<Self, String> {
        let verifier = Arc::new(AgentVerifier {
            chain,
            name,
            algorithms: provider.signature_verification_algorithms,
        });
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let presents = identity.is_some();
        let mut config = match identity {
            Some((chain, key)) => builder.with_client_auth_cert(chain, key).map_err(|e| {
                format!(
                    "client certificate and key cannot be used: {}",
                    pem::certificate_problem(&e)
                )
            })?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
            identity: presents,
        })
    }
}

/// Reads a PEM file; the error names it.
fn read(p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
}

/// Checks the agent's certificate: its chain against the CA (`chain`),
/// and its name against a configured one (`name`, else the URL's host).
/// Without `chain` any certificate is accepted
/// (`CONSUL_HTTP_SSL_VERIFY=false`); the handshake signatures are checked
/// either way, so the handshake is sound, only who signed the
/// certificate is not.
#[derive(Debug)]
struct AgentVerifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    name: Option<ServerName<'static>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AgentVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match &self.chain {
            Some(chain) => chain.verify_server_cert(
                end_entity,
                intermediates,
                self.name.as_ref().unwrap_or(server_name),
                ocsp_response,
                now,
            ),
            None => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A failed query in words: the TLS cause when there is one (reqwest's
/// own message names only the URL).
fn send_error(e: &reqwest::Error, tls_without_identity: bool) -> String {
    match rustls_cause(e) {
        Some(rustls::Error::InvalidMessage(_)) => {
            return "the Consul agent does not speak TLS on this port (it answered in plaintext): use an http:// address".into()
        }
        Some(r @ rustls::Error::InvalidCertificate(_)) => {
            return format!("the Consul agent's certificate is not trusted ({r}): check the CA and the TLS server name")
        }
        Some(r) => return format!("TLS with the Consul agent failed: {r}"),
        None => {}
    }
    let mut text = chain_text(e);
    if tls_without_identity && closed_after_handshake(&text) {
        text.push_str(CLOSED_WITHOUT_IDENTITY);
    }
    text
}

/// The rustls error behind `e`, if any. It can sit inside nested
/// `io::Error`s, whose `source()` skips the wrapped error itself, so each
/// is unwrapped by hand.
fn rustls_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(mut err) = cur {
        while let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            err = inner;
        }
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        cur = err.source();
    }
    None
}

/// An error and its sources, joined by `": "`.
fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        text.push_str(": ");
        text.push_str(&err.to_string());
        cur = err.source();
    }
    text
}

/// What to suspect when an agent closes a TLS connection and no client
/// certificate was presented: under TLS 1.3 an agent with
/// `verify_incoming` refuses the missing certificate only after the
/// client's handshake is done, and its alert can be lost to the close.
const CLOSED_WITHOUT_IDENTITY: &str = " (the agent closed the TLS connection and this client presents no certificate: an agent with verify_incoming needs one, give ConsulTls a client certificate and key)";

/// Whether a transport error reads as the connection closing under the
/// request (rather than a refused connection or a timeout).
fn closed_after_handshake(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    [
        "not ready",
        "connection reset",
        "connection closed",
        "broken pipe",
        "unexpected eof",
        "canceled",
    ]
    .iter()
    .any(|s| t.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_debug_form_shows_no_token() {
        let env = ConsulEnv::from_vars([("CONSUL_HTTP_TOKEN", "env-secret-5f1e")]);
        let d = ConsulDiscovery::with_env("http://127.0.0.1:8500".into(), env)
            .token("explicit-secret-9c2a");
        let text = format!("{d:?} {d:#?}");
        assert!(!text.contains("explicit-secret-9c2a"), "{text}");
        assert!(!text.contains("env-secret-5f1e"), "{text}");
        assert!(
            text.contains("<set>") && text.contains("127.0.0.1:8500"),
            "{text}"
        );
    }

    #[test]
    fn a_connection_closed_under_the_request_is_told_apart_from_other_failures() {
        // What hyper says when an agent with verify_incoming closes the
        // connection after a TLS 1.3 handshake without a client certificate.
        assert!(closed_after_handshake(
            "error sending request for url (https://a:8501/v1/health/service/idgen?passing): client error (Canceled): operation was canceled: connection was not ready"
        ));
        assert!(closed_after_handshake(
            "connection reset by peer (os error 104)"
        ));
        assert!(!closed_after_handshake(
            "tcp connect error: Connection refused (os error 111)"
        ));
        assert!(!closed_after_handshake("operation timed out"));
    }
}
