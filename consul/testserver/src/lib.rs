//! An in-memory, Consul-compatible HTTP server for testing idgen's Consul
//! client, with fault injection and request counters.
//!
//! It implements the part of Consul's HTTP API that idgen uses (KV with
//! cas/acquire/release, sessions with TTL, lock-delay and check binding,
//! transactions, agent services with TTL and gRPC checks, health and
//! catalog discovery, blocking queries, ACL tokens, `/v1/agent/self`),
//! with Consul's semantics as found in Consul's own source, over one
//! cluster state with one raft-like index. Several agents (HTTP listeners,
//! one node each) can share that state, and faults can be switched on per
//! agent, or cluster-wide (paused session expiry, leader elections).
//!
//! Where Consul is strict, so is this server, because a test that passes
//! against a kinder server proves less than it claims:
//!
//! - a txn `lock` inside a key's lock-delay is refused (409, `failed to
//!   lock key "<k>" due to lock delay`), like `?acquire`;
//! - a session TTL outside [`Config::min_ttl`] (Consul's `session_ttl_min`,
//!   10 s) to 24 h answers 500 `Invalid Session TTL '<ns>'`;
//! - a session expires 2 x TTL after its last renew (by default), and a
//!   leader election ([`Faults::leader_election`]) restarts every timer at
//!   2 x TTL and forgets lock-delays, as a new Consul leader does;
//! - a plain set or `cas` on a locked key writes LockIndex 0 and keeps the
//!   holder;
//! - a gRPC check `Interval` under 1 s is raised to 1 s, the first probe
//!   comes after a random pause of up to one interval, and critical
//!   services are reaped by a loop every [`Config::check_reap_interval`]
//!   (30 s), not at the moment they are due;
//! - several datacenters ([`TestConsul::add_datacenter`]) each keep their
//!   own KV, sessions, catalog and raft index; `?dc=NAME` serves a request
//!   from NAME's state (a session for a node NAME does not know is
//!   refused), an unknown NAME answers 500 `No path to datacenter`, and a
//!   linked one that is cut off ([`Faults::wan_partition`],
//!   [`Faults::datacenter_down`]) or shut down answers 500 `Remote DC has
//!   no server currently reachable`, as Consul's `forwardDC` does;
//! - `PUT /v1/snapshot` restores keys with the indexes they had when the
//!   snapshot was taken (a client's cached ModifyIndex can match again),
//!   moves the raft index past both, brings back the snapshot's sessions
//!   with their timers restarted at 2 x TTL, and needs a management token;
//! - `X-Consul-Index`, `X-Consul-KnownLeader` and `X-Consul-LastContact`
//!   come with served reads only (a 404 of a missing key included), never
//!   with a write or an error.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use consul_testserver::{Config, TestConsul};
//! let consul = TestConsul::start(Config::default()).await?;
//! let base = format!("http://{}/v1", consul.addr());
//! consul.faults().no_leader("agent-0", true); // every answer: 500 No cluster leader
//! # let _ = base;
//! consul.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - `state`: the pure core. KV, sessions, catalog and transactions as
//!   plain data with an injected `now`; no I/O, no tokio.
//! - `cluster`: the one mutex around the state, the published index that
//!   blocking queries watch, and the token table.
//! - `http`: one agent's HTTP API: routing, common headers, tokens,
//!   faults, blocking queries, and the JSON of each endpoint.
//! - `listener`: the accept loop and connections of one agent, including
//!   closing and reopening the socket for the `refuse` fault.
//! - `timers`: the task that fires session and check deadlines.
//! - `latency`: the Raft write and consistent read latency model
//!   ([`Config::raft_write_delay`], [`Config::consistent_read_delay`]).
//! - `grpc_probe`: the tasks that run gRPC health checks.
//! - `faults`, `counters`, `acl`, `config`, `duration`: fault switches,
//!   request counters, token policies, settings, Go duration strings.
//!
//! # Deviations from Consul
//!
//! - Only KV operations in transactions; only TTL and gRPC checks. A gRPC
//!   check with `GRPCUseTLS` trusts only [`Config::check_tls`]'s CA;
//!   `TLSSkipVerify: true` is refused (400).
//! - With [`Config::https`] every agent serves HTTPS only (Consul can
//!   serve both on two ports); a plaintext request gets Go's 400 answer.
//! - `?token=` in the query string is ignored (idgen must send a header).
//! - An agent's node always exists; nodes are not deregistered.
//! - Datacenters live in one process and are linked at creation (no WAN
//!   gossip, no `-join-wan`); ACL tokens are shared at once (Consul
//!   replicates them from the primary with a lag). One server per
//!   datacenter that is always the leader, except for the faults. An election is instant: no leaderless window unless a
//!   test adds one with [`Faults::no_leader`].
//! - ACLs are all-or-nothing per token policy (no default policy
//!   `allow`): with ACLs on, a request without a known token is refused,
//!   `/v1/status/leader` and `/v1/agent/self` included.
//! - Besides Consul's API it serves a control API for out-of-process
//!   tests, outside `/v1`: `PUT /_testserver/leader-election`,
//!   `PUT /_testserver/wan-partition?on=true|false[&dc=NAME]`.

#![warn(missing_docs)]

mod acl;
mod cluster;
mod config;
mod counters;
mod duration;
mod faults;
mod grpc_probe;
mod http;
mod latency;
mod listener;
mod state;
mod timers;
mod tls;

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use acl::Policy;
pub use config::{CheckTlsConfig, Config, HttpsConfig};
pub use faults::Faults;
pub use state::catalog::{CheckInfo, HealthStatus, ServiceInfo};
pub use state::kv::KvEntry;
pub use state::session::{Behavior, SessionInfo};

use cluster::{Cluster, Federation};
use http::AgentContext;

/// Parses a Go duration string (`"10s"`, `"1m30s"`, `"250ms"`), the form
/// Consul's settings take; for the binary's flags.
pub fn parse_go_duration(text: &str) -> Option<std::time::Duration> {
    duration::parse(text)
}

/// Name of the agent [`TestConsul::start`] creates.
pub const FIRST_AGENT: &str = "agent-0";

/// A running test cluster. Clones share it; it stops on
/// [`shutdown`](Self::shutdown) or when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct TestConsul {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cluster: Arc<Cluster>,
    addr: SocketAddr,
    /// Dropping it (with the last handle) stops every task.
    shutdown: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The HTTPS acceptor every agent uses (`Config::https`).
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
}

impl TestConsul {
    /// Starts a cluster whose first agent, `agent-0`, listens on
    /// `127.0.0.1:0` (HTTPS with [`Config::https`]).
    pub async fn start(config: Config) -> io::Result<TestConsul> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        Self::serve(config, listener).await
    }

    /// Starts a cluster whose first agent, `agent-0`, serves on `listener`
    /// (used by the binary for `--listen`).
    /// Fails on unusable [`Config::https`] PEM data.
    pub async fn serve(config: Config, listener: TcpListener) -> io::Result<TestConsul> {
        let primary = config
            .primary_datacenter
            .clone()
            .unwrap_or_else(|| config.datacenter.clone());
        let federation = Arc::new(Federation::new(&primary, config.acl_master_token.clone()));
        let name = config.datacenter.clone();
        Self::serve_datacenter(config, &name, federation, listener).await
    }

    /// Starts another datacenter, `name`, linked with this one (and every
    /// datacenter linked with it) as Consul's WAN federation links them:
    /// its own KV, sessions, catalog and raft index, its first agent
    /// `agent-0` on `127.0.0.1:0`, and the same settings and ACL tokens.
    /// Requests with `?dc=name` to any linked agent are served by its
    /// state. The returned handle is that datacenter's: its
    /// [`faults`](Self::faults), [`add_agent`](Self::add_agent),
    /// [`kv_get`](Self::kv_get) and [`shutdown`](Self::shutdown) act on it
    /// alone. Fails if a running datacenter already has that name.
    pub async fn add_datacenter(&self, name: &str) -> io::Result<TestConsul> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        self.serve_linked_datacenter(name, listener).await
    }

    /// [`add_datacenter`](Self::add_datacenter) with its first agent on
    /// `listener` (used by the binary for `--datacenter NAME=ADDR`).
    pub async fn serve_linked_datacenter(
        &self,
        name: &str,
        listener: TcpListener,
    ) -> io::Result<TestConsul> {
        let mut config = self.inner.cluster.config.clone();
        config.datacenter = name.to_owned();
        let federation = Arc::clone(&self.inner.cluster.federation);
        Self::serve_datacenter(config, name, federation, listener).await
    }

    async fn serve_datacenter(
        config: Config,
        name: &str,
        federation: Arc<Federation>,
        listener: TcpListener,
    ) -> io::Result<TestConsul> {
        if name.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a datacenter needs a name",
            ));
        }
        let tls = config.https.as_ref().map(tls::acceptor).transpose()?;
        crate::tls::probe_config(&config.check_tls)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("check TLS: {e}")))?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let cluster = Arc::new(Cluster::new(
            config,
            name,
            Arc::clone(&federation),
            shutdown_rx,
        ));
        if !federation.link(&cluster) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("datacenter {name:?} already exists"),
            ));
        }
        let timer = tokio::spawn(timers::run(Arc::clone(&cluster)));
        let addr = listener.local_addr()?;
        let consul = TestConsul {
            inner: Arc::new(Inner {
                cluster,
                addr,
                shutdown,
                tasks: Mutex::new(vec![timer]),
                tls,
            }),
        };
        consul.start_agent(FIRST_AGENT, listener)?;
        Ok(consul)
    }

    /// The name of this handle's datacenter.
    pub fn datacenter(&self) -> &str {
        &self.inner.cluster.datacenter
    }

    fn start_agent(&self, name: &str, listener: TcpListener) -> io::Result<SocketAddr> {
        let cluster = &self.inner.cluster;
        if !cluster.write(|st| st.add_node(name)) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("agent {name:?} already exists"),
            ));
        }
        let addr = listener.local_addr()?;
        let faults = cluster.faults.agent(name);
        let listener = Arc::new(listener);
        {
            let mut slot = faults.slot();
            slot.addr = Some(addr);
            slot.active = Some(Arc::clone(&listener));
        }
        let agent = Arc::new(AgentContext {
            name: name.to_owned(),
            cluster: Arc::clone(cluster),
            faults,
        });
        let task = tokio::spawn(listener::accept_loop(
            agent,
            listener,
            self.inner.tls.clone().map(tokio_rustls::TlsAcceptor::from),
        ));
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(task);
        Ok(addr)
    }

    /// Address of `agent-0`.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Starts another agent named `name` on `127.0.0.1:0`, sharing the
    /// cluster state, as a node with its own local agent. Services it
    /// registers belong to node `name`.
    pub async fn add_agent(&self, name: &str) -> io::Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        self.start_agent(name, listener)
    }

    /// The fault switches.
    pub fn faults(&self) -> Faults {
        Faults {
            cluster: Arc::clone(&self.inner.cluster),
        }
    }

    /// Requests received by `agent` (all agents with `None`) on `endpoint`
    /// (`"*"` for all), including requests answered by a fault. Endpoint
    /// names: `kv`, `txn`, `session/create`, `session/renew`,
    /// `session/destroy`, `session/info`, `session/list`, `session/node`,
    /// `agent/service/register`, `agent/service/deregister`,
    /// `agent/check/pass`, `agent/check/warn`, `agent/check/fail`,
    /// `agent/check/update`, `agent/services`, `agent/checks`,
    /// `health/service`, `catalog/services`, `status/leader`, `agent/self`,
    /// `snapshot`, and `other`. Control API calls (`/_testserver/...`) are not counted.
    pub fn request_count(&self, agent: Option<&str>, endpoint: &str) -> u64 {
        self.inner.cluster.counters.get(agent, endpoint)
    }

    /// Adds an ACL token with `policy`. Effective only when
    /// [`Config::acl_master_token`] is set (ACLs enabled).
    pub fn add_token(&self, secret: &str, policy: Policy) {
        self.inner.cluster.add_token(secret, policy);
    }

    /// The current entry of `key`, bypassing HTTP and ACLs.
    pub fn kv_get(&self, key: &str) -> Option<KvEntry> {
        self.inner.cluster.read(|st| st.kv.get(key).cloned())
    }

    /// Every live session.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        self.inner
            .cluster
            .read(|st| st.session_list().map(|s| s.info.clone()).collect())
    }

    /// Every registered service, with its checks and aggregated status.
    pub fn services(&self) -> Vec<ServiceInfo> {
        self.inner.cluster.read(|st| st.service_infos())
    }

    /// The cluster's raft index (the index of the latest write).
    pub fn index(&self) -> u64 {
        self.inner.cluster.read(|st| st.index)
    }

    /// Stops every agent and background task, and waits for them. Other
    /// clones of this handle stop working too.
    pub async fn shutdown(self) {
        self.inner.shutdown.send_replace(true);
        let tasks: Vec<JoinHandle<()>> = std::mem::take(
            &mut *self
                .inner
                .tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for task in tasks {
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "task failed during shutdown");
            }
        }
    }
}
