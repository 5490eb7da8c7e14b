//! The config file as read: one serde struct per `[section]`, with
//! defaults and human-readable durations, layered from built-in defaults,
//! the TOML file, `IDGEN_*` environment variables and CLI flags. Nothing
//! here is checked beyond its type; `validate.rs` turns a [`FileConfig`]
//! into the runtime [`super::Config`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use super::environment::{check_environment, edit_distance};
pub use super::layout::LayoutSection;
use super::{invalid, ConfigError};
use crate::cluster::worker_lock::WorkerLockSettings;

/// The config file, section by section. Unknown keys are an error, so a typo
/// never silently falls back to a default.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    /// This node's place in the ID layout.
    pub node: NodeSection,
    /// Listeners and request limits.
    pub server: ServerSection,
    /// Where durable state lives.
    pub store: StoreSection,
    /// The snowflake bit layout.
    pub layout: LayoutSection,
    /// Clock fault tolerance.
    pub clock: ClockSection,
    /// High-water mark reservation.
    pub hwm: HwmSection,
    /// Consul cluster mode (`store.backend = "consul"`).
    pub consul: ConsulSection,
    /// Segment mode.
    pub segment: SegmentSection,
    /// Lease mode.
    pub lease: LeaseSection,
    /// Strict mode.
    pub strict: StrictSection,
    /// Formatted mode's settings.
    pub formatted: FormattedSection,
    /// Formatted mode's formats (`[[formats]]`), each a template, a Lua
    /// rule or a preset.
    pub formats: Vec<crate::id::format::FormatDef>,
    /// The admin API.
    pub admin: AdminSection,
    /// Logging.
    pub log: LogSection,
    /// Hiding volume: where the hide master key comes from.
    pub hide: super::hide::HideSection,
    /// For idgen's own test suite only; unsupported, and deliberately not
    /// in `config/idgen.example.toml`. Left out of the printed settings
    /// (`idgen check-config`) while at its defaults, so users are never
    /// shown a section they must not set.
    #[serde(skip_serializing_if = "TestingSection::is_default")]
    pub testing: TestingSection,
}

/// Consul's default `session_ttl_min`: a Consul server refuses to create a
/// session with a shorter TTL (HTTP 500 `Invalid Session TTL`).
pub const CONSUL_SESSION_TTL_MIN: Duration = Duration::from_secs(10);

/// `[testing]`: settings that exist only so idgen's own tests can run with
/// timings no production Consul accepts. Unsupported: never set them in a
/// deployment. They are left out of `config/idgen.example.toml` on purpose
/// (its test checks that this is the only section missing).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TestingSection {
    /// The shortest `consul.session_ttl` accepted. Consul's own minimum is
    /// its server option `session_ttl_min`, 10 s by default, and that is
    /// the default here; the test suite lowers both (consul-testserver's
    /// `Config::min_ttl` mirrors `session_ttl_min`) to run with 1 s to 2 s
    /// TTLs. 1 s to 10 s.
    #[serde(with = "humantime_serde")]
    pub consul_session_ttl_min: Duration,
}

impl TestingSection {
    /// Every key at its default (so nothing here is in force).
    pub fn is_default(&self) -> bool {
        // Destructured, so a new key cannot be forgotten here.
        let Self {
            consul_session_ttl_min,
        } = self;
        *consul_session_ttl_min == CONSUL_SESSION_TTL_MIN
    }
}

impl Default for TestingSection {
    fn default() -> Self {
        Self {
            consul_session_ttl_min: CONSUL_SESSION_TTL_MIN,
        }
    }
}

/// `[node]`
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeSection {
    /// Datacenter id (must fit `layout` datacenter bits).
    pub datacenter_id: u64,
    /// Worker id (must fit `layout` worker bits; unique per datacenter).
    /// With Consul it is used only when `consul.worker = "static"`.
    pub worker_id: u64,
    /// Stable name of this node across restarts; with Consul it lets a
    /// restarted node take back its worker id. Empty: `<hostname>-<port>`.
    pub instance_id: String,
    /// The gRPC address clients and the Consul agent dial. Empty: the bound
    /// `server.grpc_listen` address (which must then not be 0.0.0.0).
    pub advertise: String,
}

/// `[server]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    /// gRPC listen address.
    pub grpc_listen: String,
    /// HTTP listen address (metrics, health, JSON API).
    pub http_listen: String,
    /// Largest `count` a GenIds call may ask for.
    pub max_batch: u32,
    /// Largest gRPC request message, in bytes; larger ones are refused
    /// with RESOURCE_EXHAUSTED before they are read.
    pub max_request_size: u32,
    /// Longest a call may wait for a free sequence before UNAVAILABLE.
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
    /// How long shutdown waits for in-flight calls to finish.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Most open connections on the gRPC port; past it a new connection is
    /// closed at once (the client can go to another node).
    pub grpc_max_connections: u32,
    /// Most open connections on the HTTP port, likewise.
    pub http_max_connections: u32,
    /// Most open connections from one peer address (one IPv6 /64) on each
    /// port. Past it, that peer's longest-waiting connection that has not
    /// sent its request headers (or HTTP/2 preface) is closed to let the
    /// new one in, or the new one is refused if all are busy. Raise it when
    /// many clients share one address (NAT, a proxy).
    pub max_connections_per_peer: u32,
    /// Deadline for a new gRPC connection's HTTP/2 preface, and for each
    /// HTTP/1 request's headers (also the wait for the next request on a
    /// kept-alive HTTP connection).
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Deadline from a call's request headers to its complete request
    /// (an HTTP/2 stream's END_STREAM, an HTTP/1 body's last byte). A call
    /// still short of it is answered DEADLINE_EXCEEDED (408 on HTTP), and
    /// its connection is closed first to make room from then on.
    #[serde(with = "humantime_serde")]
    pub request_body_timeout: Duration,
    /// A gRPC connection with no call in progress for this long is closed
    /// (GOAWAY first, so clients reconnect cleanly).
    #[serde(with = "humantime_serde")]
    pub grpc_idle_timeout: Duration,
    /// How often an HTTP/2 ping checks a quiet gRPC connection's peer.
    #[serde(with = "humantime_serde")]
    pub grpc_keepalive_interval: Duration,
    /// A ping not answered within this closes the connection.
    #[serde(with = "humantime_serde")]
    pub grpc_keepalive_timeout: Duration,
    /// Most calls in flight on one gRPC connection (HTTP/2
    /// MAX_CONCURRENT_STREAMS); clients queue the rest.
    pub grpc_max_concurrent_streams: u32,
    /// Largest request header block in bytes, on both ports.
    pub max_header_size: u32,
    /// Allow plaintext on a non-loopback address (no `[server.tls]`).
    /// Off by default: anyone on the path could read the admin token and
    /// the IDs. Only for networks that are private by other means.
    pub insecure: bool,
    /// `[server.tls]`: serve both ports over TLS.
    pub tls: TlsSection,
    /// Peer networks (CIDR, IPv4 or IPv6) allowed on both ports; others
    /// get PERMISSION_DENIED / 403 on every call. Empty: all.
    pub allow: Vec<String>,
    /// `[server.http]`: the HTTP API's browser settings.
    pub http: HttpSection,
}

/// `[server.http]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSection {
    /// Web origins (`https://app.example.com`) a browser page may call the
    /// `/v1/` endpoints from (CORS), or `["*"]` for any. Empty: none.
    pub cors_allow_origins: Vec<String>,
}

/// `[server.tls]`: TLS (rustls) on the gRPC and HTTP ports. Both files
/// empty: plaintext.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSection {
    /// Certificate chain, PEM, leaf first.
    pub cert: PathBuf,
    /// Private key of the leaf certificate, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificate(s), PEM, that client certificates must chain to.
    /// Empty: no client certificates are asked for.
    pub client_ca: PathBuf,
    /// Refuse the handshake of a client without a certificate from
    /// `client_ca` (mTLS on every call). Off: a certificate is optional,
    /// checked when sent, and needed only where `admin.client_cert_names`
    /// asks for one.
    pub client_required: bool,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            grpc_listen: "127.0.0.1:50051".into(),
            http_listen: "127.0.0.1:9464".into(),
            max_batch: 10_000,
            max_request_size: 65_536,
            max_wait: Duration::from_secs(2),
            shutdown_grace: Duration::from_secs(10),
            grpc_max_connections: 768,
            http_max_connections: 128,
            max_connections_per_peer: 64,
            header_timeout: Duration::from_secs(10),
            request_body_timeout: Duration::from_secs(5),
            grpc_idle_timeout: Duration::from_secs(300),
            grpc_keepalive_interval: Duration::from_secs(30),
            grpc_keepalive_timeout: Duration::from_secs(10),
            grpc_max_concurrent_streams: 200,
            max_header_size: 16_384,
            insecure: false,
            tls: TlsSection::default(),
            allow: Vec::new(),
            http: HttpSection::default(),
        }
    }
}

/// `[store]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSection {
    /// Backend: `embedded` (a local redb state file) or `consul`.
    pub backend: BackendKind,
    /// Path of the embedded state file.
    pub path: PathBuf,
    /// Create the state file when it is missing. For development only: in
    /// production a missing file means lost state, which must stop start-up.
    pub init_if_missing: bool,
    /// A copy of the state file rewritten (synced, then renamed into
    /// place) after every write and before that write's IDs are handed
    /// out, so it is never behind what the node issued: restoring from it
    /// needs no margin. Embedded only; best on another disk. Empty: none.
    pub mirror_path: PathBuf,
    /// How long the node may be unable to issue (its store cannot write,
    /// or it is fenced) before `/healthz` fails too, so an orchestrator
    /// restarts it. Readiness fails at once either way.
    #[serde(with = "humantime_serde")]
    pub max_unhealthy: Duration,
}

impl Default for StoreSection {
    fn default() -> Self {
        Self {
            backend: BackendKind::Embedded,
            path: PathBuf::from(DEFAULT_STATE_PATH),
            init_if_missing: false,
            mirror_path: PathBuf::new(),
            max_unhealthy: Duration::from_secs(180),
        }
    }
}

/// `[clock]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClockSection {
    /// Largest wall-clock step back that is ridden out on the logical clock.
    #[serde(with = "humantime_serde")]
    pub max_backward: Duration,
    /// Largest amount the clock may be behind the stored high-water mark at
    /// start-up.
    #[serde(with = "humantime_serde")]
    pub max_startup_skew: Duration,
}

impl Default for ClockSection {
    fn default() -> Self {
        Self {
            max_backward: Duration::from_secs(1),
            max_startup_skew: Duration::from_secs(10),
        }
    }
}

/// `[hwm]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HwmSection {
    /// How far ahead of the wall clock the durable mark is kept.
    #[serde(with = "humantime_serde")]
    pub reserve: Duration,
    /// How often the mark is extended.
    #[serde(with = "humantime_serde")]
    pub renew_interval: Duration,
}

impl Default for HwmSection {
    fn default() -> Self {
        Self {
            reserve: Duration::from_secs(3),
            renew_interval: Duration::from_secs(1),
        }
    }
}

/// `[consul]`: only read when `store.backend = "consul"`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsulSection {
    /// Base URL of the local Consul agent: `http://host:port`, or
    /// `https://host:port` (its HTTPS port, 8501 by default) with
    /// `ca_file`.
    pub address: String,
    /// CA certificate(s), PEM, that signed the agent's HTTPS certificate.
    /// Needed by, and only allowed with, an `https://` address.
    pub ca_file: PathBuf,
    /// Client certificate chain, PEM, for an agent with
    /// `verify_incoming` (mTLS). Set with `key_file`.
    pub cert_file: PathBuf,
    /// Private key of `cert_file`, PEM.
    pub key_file: PathBuf,
    /// Name the agent's certificate must carry, when it differs from the
    /// address's host (an agent dialled by IP, or a certificate for
    /// `server.<datacenter>.consul`). Empty: the address's host.
    pub tls_server_name: String,
    /// With `[server.tls]`: the name the agent's gRPC health probe checks
    /// this node's certificate against (the check's `TLSServerName`).
    /// Empty: the advertised IP if the certificate carries it, else the
    /// certificate's first DNS name.
    pub check_tls_server_name: String,
    /// ACL token. Prefer `token_file` or `IDGEN_CONSUL__TOKEN`; never logged.
    pub token: String,
    /// File holding the ACL token (whitespace trimmed).
    pub token_file: PathBuf,
    /// KV prefix; keys live under `<prefix>/<cluster>/`.
    pub prefix: String,
    /// A local file where the node keeps the highest Consul index it saw
    /// under `<prefix>/<cluster>/`, so that after a restart it still
    /// notices a snapshot restore (or a Consul rebuilt empty). Empty: not
    /// kept (a WARN at start); `$STATE_DIRECTORY/consul-index.json` under
    /// systemd's `StateDirectory=`.
    pub index_file: PathBuf,
    /// Cluster name: nodes sharing it share worker ids and marks.
    pub cluster: String,
    /// Consul service name.
    pub service: String,
    /// `auto` (claim the lowest free id, or the one this instance held) or
    /// `static` (claim exactly `node.worker_id`).
    pub worker: WorkerClaim,
    /// Session TTL of the worker lock.
    #[serde(with = "humantime_serde")]
    pub session_ttl: Duration,
    /// Lock-delay of the worker lock after its session is invalidated.
    #[serde(with = "humantime_serde")]
    pub lock_delay: Duration,
    /// Safety margin: the node stops issuing this long before its worker
    /// lock could run out on the server.
    #[serde(with = "humantime_serde")]
    pub lock_margin: Duration,
    /// `lock_margin`'s old name, still read (file and environment) and
    /// moved into `lock_margin` at load; never written out.
    #[serde(default, skip_serializing, with = "humantime_serde::option")]
    pub lease_margin: Option<Duration>,
    /// Timeout of one Consul request.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Extra attempts for a failed idempotent request.
    pub retries: u32,
    /// How often the agent probes the gRPC health check.
    #[serde(with = "humantime_serde")]
    pub check_interval: Duration,
    /// Timeout of one health probe.
    #[serde(with = "humantime_serde")]
    pub check_timeout: Duration,
    /// The agent removes the service after its check stayed critical this long.
    #[serde(with = "humantime_serde")]
    pub deregister_critical_after: Duration,
    /// Longest pause between attempts to claim a worker id again after the
    /// worker lock was lost.
    #[serde(with = "humantime_serde")]
    pub reclaim_backoff_max: Duration,
    /// The Consul datacenter whose KV registers every datacenter id of
    /// the federation, so two Consul datacenters never share one. Empty:
    /// this node's own Consul datacenter (no registry across datacenters:
    /// set it on every datacenter's nodes to name the primary).
    pub primary_datacenter: String,
}

impl Default for ConsulSection {
    fn default() -> Self {
        let lock = WorkerLockSettings::default();
        Self {
            address: "http://127.0.0.1:8500".into(),
            ca_file: PathBuf::new(),
            cert_file: PathBuf::new(),
            key_file: PathBuf::new(),
            tls_server_name: String::new(),
            check_tls_server_name: String::new(),
            token: String::new(),
            token_file: PathBuf::new(),
            prefix: "idgen".into(),
            index_file: PathBuf::new(),
            cluster: "default".into(),
            service: "idgen".into(),
            worker: WorkerClaim::Auto,
            session_ttl: lock.ttl,
            lock_delay: lock.lock_delay,
            lock_margin: lock.margin,
            lease_margin: None,
            timeout: Duration::from_secs(2),
            retries: 2,
            check_interval: Duration::from_secs(5),
            check_timeout: Duration::from_secs(2),
            deregister_critical_after: Duration::from_secs(60),
            reclaim_backoff_max: Duration::from_secs(5),
            primary_datacenter: String::new(),
        }
    }
}

/// Old key names still read, as (section__key) -> the key they set.
pub(crate) const KEY_ALIASES: &[(&str, &str)] = &[("consul__lease_margin", "consul.lock_margin")];

impl ConsulSection {
    /// Moves the old `lease_margin` into `lock_margin`; refuses both set
    /// to different values (which one was meant cannot be known).
    fn take_old_margin(&mut self) -> Result<(), ConfigError> {
        let Some(old) = self.lease_margin.take() else {
            return Ok(());
        };
        let default = Self::default().lock_margin;
        if self.lock_margin != default && self.lock_margin != old {
            return Err(invalid(
                "consul.lease_margin",
                "is the old name of consul.lock_margin, which is set too: keep only lock_margin",
            ));
        }
        self.lock_margin = old;
        Ok(())
    }
}

impl fmt::Debug for ConsulSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulSection")
            .field("address", &self.address)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("tls_server_name", &self.tls_server_name)
            .field("check_tls_server_name", &self.check_tls_server_name)
            .field("token", &(!self.token.is_empty()).then_some("<redacted>"))
            .field("token_file", &self.token_file)
            .field("prefix", &self.prefix)
            .field("cluster", &self.cluster)
            .field("worker", &self.worker)
            .field("session_ttl", &self.session_ttl)
            .field("lock_delay", &self.lock_delay)
            .finish_non_exhaustive()
    }
}

/// `[segment]`: dense per-tag numbers from ranges (Leaf style).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SegmentSection {
    /// Serve `mode = segment`.
    pub enabled: bool,
    /// Create an unknown tag on first use, starting at 1 with
    /// `default_step`. Off: unknown tags are NOT_FOUND.
    pub auto_create: bool,
    /// Step of auto-created tags.
    pub default_step: u64,
    /// Cap of the dynamic step (a range used up in under 15 minutes
    /// doubles the next one).
    pub max_step: u64,
    /// Most live tags (admin-created and auto-created together); creating
    /// one more is RESOURCE_EXHAUSTED. Deleted tags (tombstones) do not
    /// count. Bounds the state a client can make the store keep.
    pub max_tags: u64,
    /// A tag not used on this node for this long has its buffers dropped
    /// from memory (their unused IDs become a gap, never reused); the next
    /// call takes a fresh range.
    #[serde(with = "humantime_serde")]
    pub idle_release: Duration,
}

impl Default for SegmentSection {
    fn default() -> Self {
        Self {
            enabled: false,
            auto_create: false,
            default_step: 1000,
            max_step: 1_000_000,
            max_tags: 10_000,
            idle_release: Duration::from_secs(3600),
        }
    }
}

/// `[lease]`: clock-free IDs `zone | token | sequence`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseSection {
    /// Serve `mode = lease`.
    pub enabled: bool,
    /// Zone (0 to 127), the top field of every lease ID.
    pub zone: u64,
    /// Embedded store: the token to start with. Unset (the default): the
    /// first token of this node's own range, derived from its datacenter
    /// and worker id (see [`crate::id::lease::node_token_range`]); a
    /// token outside that range is refused, since another embedded node
    /// owns it. The node moves to the next token of its range when one is
    /// used up. Consul: tokens are claimed automatically and this is
    /// ignored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// Sequences reserved per block (1 to 100000000); the next block is
    /// reserved when half of the current one is used.
    pub block: u64,
    /// `[lease.hide]`: show this zone's IDs through hide key `key` with
    /// `version_bits` (default 4) of key version. Recorded for the zone
    /// the first time a node serves it, and frozen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hide: Option<crate::id::lease::ZoneHide>,
}

impl Default for LeaseSection {
    fn default() -> Self {
        Self {
            enabled: false,
            zone: 0,
            token: None,
            block: 1000,
            hide: None,
        }
    }
}

/// `[strict]`: cluster-wide strictly increasing counters per key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StrictSection {
    /// Serve `mode = strict`.
    pub enabled: bool,
    /// Step of namespaces without one set by the admin API (1 to 1000000).
    pub default_step: u64,
    /// Most live keys in one namespace; the call that would create one
    /// more is RESOURCE_EXHAUSTED. Deleted keys (tombstones) do not count.
    pub max_keys_per_namespace: u64,
    /// Most namespaces with live keys, so the total is bounded too.
    pub max_namespaces: u64,
    /// Not supported: strict values are consecutive by contract, so they
    /// are never hidden. Present only to refuse it with a clear error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hide: Option<toml::Value>,
}

impl Default for StrictSection {
    fn default() -> Self {
        Self {
            enabled: false,
            default_step: 1,
            max_keys_per_namespace: 100_000,
            max_namespaces: 100,
            hide: None,
        }
    }
}

/// `[formatted]`: how formatted mode reserves counter values.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FormattedSection {
    /// Counter values reserved per durable write (1 to 1000000). A restart
    /// skips what is left of the block, so counters show gaps of up to
    /// this many; 1 gives gap-free counters at one write per ID.
    pub block: u64,
    /// How long one call of a Lua rule's `create_id` may run (1ms to
    /// 10s). A call past it answers FAILED_PRECONDITION naming the rule.
    #[serde(with = "humantime_serde")]
    pub lua_deadline: Duration,
    /// Threads Lua rules run on (1 to 64), off the request runtime.
    pub lua_workers: usize,
    /// Wall-clock time loading one Lua rule may take, its load-time checks
    /// included (100ms to 10m). A rule whose checks do not finish within
    /// it is refused (INVALID_ARGUMENT at CreateFormat) naming this key.
    #[serde(with = "humantime_serde")]
    pub lua_check_budget: Duration,
    /// Most counters one format keeps (1 to 1000000): each new value of a
    /// format's `scope_params` adds one, durably and for good (a counter is
    /// never deleted: a new one for a used value could repeat its IDs).
    /// Past it a new value is refused with RESOURCE_EXHAUSTED; values
    /// already used go on.
    pub max_scope_values: u64,
}

impl Default for FormattedSection {
    fn default() -> Self {
        Self {
            block: 100,
            lua_deadline: Duration::from_millis(50),
            lua_workers: 4,
            lua_check_budget: crate::id::format::lua::DEFAULT_CHECK_BUDGET,
            max_scope_values: 10_000,
        }
    }
}

/// `[admin]`: the admin API (`idgen.v1.Admin`).
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSection {
    /// The bearer token admin calls must send. Empty (and no `token_file`):
    /// the admin API refuses every call. Prefer `token_file` or
    /// `IDGEN_ADMIN__TOKEN`; never logged.
    pub token: String,
    /// A file holding the admin token.
    pub token_file: PathBuf,
    /// Client certificate names (subject CN or a SAN DNS name, email or
    /// URI) allowed to make admin calls; needs `server.tls.client_ca`.
    /// With a token as well, a call needs both.
    pub client_cert_names: Vec<String>,
    /// Peer networks (CIDR) allowed to make admin calls, on top of
    /// `server.allow`. Empty: all.
    pub allow: Vec<String>,
}

impl fmt::Debug for AdminSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminSection")
            .field("token", &(!self.token.is_empty()).then_some("<redacted>"))
            .field("token_file", &self.token_file)
            .field("client_cert_names", &self.client_cert_names)
            .field("allow", &self.allow)
            .finish()
    }
}

/// `[log]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSection {
    /// A tracing filter, e.g. `info` or `idgen=debug,info`. `RUST_LOG` wins.
    pub level: String,
    /// `text` or `json`.
    pub format: LogFormat,
    /// Colour codes in text logs: `auto` (only when stderr is a terminal
    /// and `NO_COLOR` is unset), `always` or `never`.
    pub color: LogColor,
}

/// When text logs carry ANSI colour codes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogColor {
    /// Only when stderr is a terminal and `NO_COLOR` is not set.
    #[default]
    Auto,
    /// Always (e.g. a terminal multiplexer that is not detected).
    Always,
    /// Never.
    Never,
}

impl LogColor {
    /// Whether to colour, given whether stderr is a terminal.
    pub fn enabled(self, stderr_is_terminal: bool) -> bool {
        match self {
            LogColor::Always => true,
            LogColor::Never => false,
            LogColor::Auto => stderr_is_terminal && std::env::var_os("NO_COLOR").is_none(),
        }
    }
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: LogFormat::Text,
            color: LogColor::Auto,
        }
    }
}

/// Values given on the command line; they win over file and environment.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--grpc-listen`
    pub grpc_listen: Option<String>,
    /// `--http-listen`
    pub http_listen: Option<String>,
    /// `--state`
    pub state_path: Option<PathBuf>,
    /// `--datacenter-id`
    pub datacenter_id: Option<u64>,
    /// `--worker-id`
    pub worker_id: Option<u64>,
}

impl FileConfig {
    /// Reads defaults, then `path` (if given; it must exist), then the
    /// `IDGEN_` environment.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_env_prefix(path, "IDGEN_")
    }

    pub(super) fn load_with_env_prefix(
        path: Option<&Path>,
        prefix: &str,
    ) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(FileConfig::default()));
        // systemd's StateDirectory= moves the default state file; the file,
        // the environment and --state still win over it.
        if let Some(dir) = state_directory(std::env::var_os("STATE_DIRECTORY"))? {
            fig = fig.merge(Serialized::default("store.path", dir.join(STATE_FILE_NAME)));
            fig = fig.merge(Serialized::default(
                "consul.index_file",
                dir.join(CONSUL_INDEX_FILE_NAME),
            ));
        }
        if let Some(path) = path {
            if !path.exists() {
                return Err(ConfigError::Parse(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            fig = fig.merge(Toml::file_exact(path));
        }
        // Every IDGEN_* variable must name a key (or be one of the few
        // read by the CLI and scripts): a typo must never silently leave a
        // setting, such as the worker id, at its default.
        check_environment(
            prefix,
            std::env::vars_os(),
            &FileConfig::keys(),
            KEY_ALIASES,
        )?;
        fig = fig.merge(
            Env::prefixed(prefix)
                .filter(|key| key.as_str().contains("__"))
                .split("__"),
        );
        let mut file: Self = fig.extract().map_err(read_error)?;
        file.consul.take_old_margin()?;
        file.expand_paths(|name| std::env::var_os(name))?;
        Ok(file)
    }

    /// Expands `${CREDENTIALS_DIRECTORY}` in every key that names a file
    /// (see [`crate::config::expand_path`]); `lookup` reads the
    /// environment.
    pub fn expand_paths(
        &mut self,
        lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<(), ConfigError> {
        let tls = &mut self.server.tls;
        let consul = &mut self.consul;
        for (key, path) in [
            ("server.tls.cert", &mut tls.cert),
            ("server.tls.key", &mut tls.key),
            ("server.tls.client_ca", &mut tls.client_ca),
            ("store.path", &mut self.store.path),
            ("consul.ca_file", &mut consul.ca_file),
            ("consul.cert_file", &mut consul.cert_file),
            ("consul.key_file", &mut consul.key_file),
            ("consul.token_file", &mut consul.token_file),
            ("consul.index_file", &mut consul.index_file),
            ("admin.token_file", &mut self.admin.token_file),
        ] {
            *path = super::environment::expand_path(key, path, &lookup)?;
        }
        Ok(())
    }

    /// Every settable key as `(section, key)`, optional ones included.
    pub fn keys() -> Vec<(String, String)> {
        let mut full = FileConfig::default();
        // Optional keys are left out of a serialized default; give them a
        // value so they are listed too.
        full.layout.time_unit = Some(Duration::from_millis(1));
        full.layout.time_bits = Some(0);
        full.layout.datacenter_bits = Some(0);
        full.layout.worker_bits = Some(0);
        full.layout.sequence_bits = Some(0);
        let mut keys = Vec::new();
        if let Ok(serde_json::Value::Object(sections)) = serde_json::to_value(&full) {
            for (section, fields) in sections {
                if let serde_json::Value::Object(fields) = fields {
                    keys.extend(fields.keys().map(|k| (section.clone(), k.clone())));
                }
            }
        }
        keys
    }

    /// The settings as a TOML document, secrets replaced by `<redacted>`:
    /// what `idgen check-config` prints.
    pub fn redacted_toml(&self) -> Result<String, ConfigError> {
        let mut shown = self.clone();
        for secret in [&mut shown.consul.token, &mut shown.admin.token] {
            if !secret.is_empty() {
                *secret = "<redacted>".into();
            }
        }
        toml::to_string(&shown).map_err(|e| ConfigError::Parse(e.to_string()))
    }
}

/// The state file's default path, absolute so that it does not depend on
/// the directory the service happens to start in.
pub const DEFAULT_STATE_PATH: &str = "/var/lib/idgen/idgen.redb";

/// `consul.index_file`'s name inside `$STATE_DIRECTORY`.
pub const CONSUL_INDEX_FILE_NAME: &str = "consul-index.json";

/// The state file's name inside `$STATE_DIRECTORY`.
pub const STATE_FILE_NAME: &str = "idgen.redb";

/// The directory systemd created for the unit's `StateDirectory=`, from
/// the value of `STATE_DIRECTORY` (a colon-separated list when the unit
/// names several; the first is used). `None` when unset or empty. systemd
/// always passes absolute paths, so a relative one is an error rather than
/// a state file in whatever directory the node starts in.
pub fn state_directory(value: Option<std::ffi::OsString>) -> Result<Option<PathBuf>, ConfigError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let Some(value) = value.to_str() else {
        return Err(ConfigError::Parse(
            "environment variable STATE_DIRECTORY is not valid UTF-8".into(),
        ));
    };
    let Some(first) = value.split(':').next().filter(|d| !d.is_empty()) else {
        return Ok(None);
    };
    let dir = PathBuf::from(first);
    if !dir.is_absolute() {
        return Err(ConfigError::Parse(format!(
            "environment variable STATE_DIRECTORY: {first:?} is not an absolute path (systemd's StateDirectory= sets it; set store.path instead)"
        )));
    }
    Ok(Some(dir))
}

impl FileConfig {
    /// Applies command-line overrides.
    pub fn apply(&mut self, o: &Overrides) {
        if let Some(v) = &o.grpc_listen {
            self.server.grpc_listen = v.clone();
        }
        if let Some(v) = &o.http_listen {
            self.server.http_listen = v.clone();
        }
        if let Some(v) = &o.state_path {
            self.store.path = v.clone();
        }
        if let Some(v) = o.datacenter_id {
            self.node.datacenter_id = v;
        }
        if let Some(v) = o.worker_id {
            self.node.worker_id = v;
        }
    }
}

/// The config keys whose values are typed enums. A wrong value there is
/// refused while reading, by the enum's own `TryFrom<String>`; it is
/// reported like any other invalid key (`config key store.backend: ...`).
const ENUM_KEYS: [&str; 3] = ["store.backend", "log.format", "consul.worker"];

/// A figment error as a [`ConfigError`]: a refused enum value names its
/// key, everything else is a read error.
fn read_error(e: figment::Error) -> ConfigError {
    match &e.kind {
        figment::error::Kind::Message(problem) => {
            let key = e.path.join(".");
            if let Some(key) = ENUM_KEYS.into_iter().find(|k| *k == key) {
                return invalid(key, problem.clone());
            }
        }
        figment::error::Kind::UnknownField(field, expected) => {
            return unknown_key(&e, field, expected);
        }
        _ => {}
    }
    ConfigError::Parse(e.to_string())
}

/// An unknown key as the user wrote it: the file it is in and its dotted
/// key (`server.grpc_listn`, never figment's `default.` profile prefix),
/// with the nearest key serde expected there, by the same distance the
/// environment's "did you mean" uses. (The environment's typos are
/// refused before the file is read: an unknown key here is the file's.)
fn unknown_key(e: &figment::Error, field: &str, expected: &[&str]) -> ConfigError {
    let mut path: Vec<&str> = e.path.iter().map(String::as_str).collect();
    if path.last() != Some(&field) {
        path.push(field);
    }
    let parent = path[..path.len() - 1].join(".");
    let dotted = |k: &str| {
        if parent.is_empty() {
            k.to_owned()
        } else {
            format!("{parent}.{k}")
        }
    };
    let hint = expected
        .iter()
        .min_by_key(|k| edit_distance(field, k))
        .map_or_else(String::new, |k| format!("; did you mean {}?", dotted(k)));
    let place = match e.metadata.as_ref().and_then(|m| m.source.as_ref()) {
        Some(figment::Source::File(file)) => format!("config file {}", file.display()),
        Some(other) => other.to_string(),
        None => "the config".to_owned(),
    };
    ConfigError::Parse(format!("{place}: unknown key {}{hint}", path.join(".")))
}

/// Declares a config enum read from and written as a lower-case word;
/// a wrong word is refused with `$problem`, which says what to use.
macro_rules! word_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $word:literal,)+ }
     refused($other:ident) => $problem:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "&'static str")]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            /// The word the config file uses.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)+
                }
            }
        }

        impl From<$name> for &'static str {
            fn from(value: $name) -> Self {
                value.as_str()
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;

            fn try_from($other: String) -> Result<Self, String> {
                match $other.as_str() {
                    $($word => Ok($name::$variant),)+
                    _ => Err($problem),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

word_enum! {
    /// `store.backend`: where durable state lives.
    BackendKind {
        /// A local redb state file (`store.path`).
        Embedded = "embedded",
        /// Consul KV, with claimed worker ids (`[consul]`).
        Consul = "consul",
    }
    refused(other) => format!("unknown backend {other:?}; use embedded or consul")
}

word_enum! {
    /// `log.format`: how log lines are written.
    LogFormat {
        /// Human-readable lines.
        Text = "text",
        /// One JSON object per line.
        Json = "json",
    }
    refused(other) => format!("{other:?}: use text or json")
}

word_enum! {
    /// `consul.worker`: how a Consul node gets its worker id.
    WorkerClaim {
        /// Claim the lowest free id, or the one this instance held before.
        Auto = "auto",
        /// Claim exactly `node.worker_id`.
        Static = "static",
    }
    refused(other) => format!("{other:?}: use auto (claim a free id) or static (node.worker_id)")
}
