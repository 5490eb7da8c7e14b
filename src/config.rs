//! Configuration in two layers: [`FileConfig`] is what a TOML file and
//! `IDGEN_...` environment variables say, with defaults and human-readable
//! durations; [`Config`] is the validated runtime form the server uses.
//!
//! Precedence, lowest first: built-in defaults, the TOML file, environment
//! variables (`IDGEN_SECTION__KEY`, e.g. `IDGEN_NODE__WORKER_ID=3`), CLI flags.
//! `config/idgen.example.toml` documents every key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::consul::ConsulConfig;
use crate::id::{Layout, LayoutSpec, Preset};
use crate::store::consul::{ClusterKeys, LeaseSettings};

/// A config problem, naming the key and what is wrong with it.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file, or the environment, could not be read or parsed.
    #[error("cannot read config: {0}")]
    Parse(String),
    /// An `IDGEN_*` environment variable names no config key.
    #[error("environment variable {name} {problem}")]
    Environment {
        /// The variable as set.
        name: String,
        /// What is wrong and what to do.
        problem: String,
    },
    /// A key has a value that is not allowed.
    #[error("config key {key}: {problem}")]
    Invalid {
        /// Dotted key, e.g. `server.grpc_listen`.
        key: &'static str,
        /// What is wrong and what to do.
        problem: String,
    },
}

fn invalid(key: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        problem: problem.into(),
    }
}

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
    /// The admin API.
    pub admin: AdminSection,
    /// Logging.
    pub log: LogSection,
    /// For idgen's own test suite only; unsupported, and deliberately not
    /// in `config/idgen.example.toml`.
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
    /// Deadline for a new gRPC connection's HTTP/2 preface, and for each
    /// HTTP/1 request's headers (also the wait for the next request on a
    /// kept-alive HTTP connection).
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
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
            header_timeout: Duration::from_secs(10),
            grpc_idle_timeout: Duration::from_secs(300),
            grpc_keepalive_interval: Duration::from_secs(30),
            grpc_keepalive_timeout: Duration::from_secs(10),
            grpc_max_concurrent_streams: 200,
            max_header_size: 16_384,
        }
    }
}

/// Bounds on client connections (validated from `[server]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionSettings {
    /// Most open gRPC connections.
    pub grpc_max_connections: usize,
    /// Most open HTTP connections.
    pub http_max_connections: usize,
    /// HTTP/2 preface and HTTP/1 request header deadline.
    pub header_timeout: Duration,
    /// gRPC connection idle deadline.
    pub grpc_idle_timeout: Duration,
    /// HTTP/2 ping interval on gRPC connections.
    pub grpc_keepalive_interval: Duration,
    /// HTTP/2 ping answer deadline.
    pub grpc_keepalive_timeout: Duration,
    /// Calls in flight per gRPC connection.
    pub grpc_max_concurrent_streams: u32,
    /// Largest request header block, bytes.
    pub max_header_size: usize,
}

impl ServerSection {
    /// The connection bounds, each checked against a sane range.
    fn connections(&self) -> Result<ConnectionSettings, ConfigError> {
        for (key, value) in [
            ("server.grpc_max_connections", self.grpc_max_connections),
            ("server.http_max_connections", self.http_max_connections),
        ] {
            if !(1..=1_000_000).contains(&value) {
                return Err(invalid(key, "must be between 1 and 1000000"));
            }
        }
        let ms = Duration::from_millis;
        for (key, value, min, max) in [
            (
                "server.header_timeout",
                self.header_timeout,
                ms(100),
                ms(600_000),
            ),
            (
                "server.grpc_idle_timeout",
                self.grpc_idle_timeout,
                ms(100),
                ms(86_400_000),
            ),
            (
                "server.grpc_keepalive_interval",
                self.grpc_keepalive_interval,
                ms(100),
                ms(86_400_000),
            ),
            (
                "server.grpc_keepalive_timeout",
                self.grpc_keepalive_timeout,
                ms(100),
                ms(600_000),
            ),
        ] {
            check_duration(key, value, min, max)?;
        }
        if !(1..=100_000).contains(&self.grpc_max_concurrent_streams) {
            return Err(invalid(
                "server.grpc_max_concurrent_streams",
                "must be between 1 and 100000",
            ));
        }
        if !(1024..=1 << 20).contains(&self.max_header_size) {
            return Err(invalid(
                "server.max_header_size",
                "must be between 1024 and 1048576 bytes",
            ));
        }
        Ok(ConnectionSettings {
            grpc_max_connections: self.grpc_max_connections as usize,
            http_max_connections: self.http_max_connections as usize,
            header_timeout: self.header_timeout,
            grpc_idle_timeout: self.grpc_idle_timeout,
            grpc_keepalive_interval: self.grpc_keepalive_interval,
            grpc_keepalive_timeout: self.grpc_keepalive_timeout,
            grpc_max_concurrent_streams: self.grpc_max_concurrent_streams,
            max_header_size: self.max_header_size as usize,
        })
    }
}

/// `[store]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSection {
    /// Backend: `embedded` (a local redb state file) or `consul`.
    pub backend: String,
    /// Path of the embedded state file.
    pub path: PathBuf,
    /// Create the state file when it is missing. For development only: in
    /// production a missing file means lost state, which must stop start-up.
    pub init_if_missing: bool,
    /// How long the node may be unable to issue (its store cannot write,
    /// or it is fenced) before `/healthz` fails too, so an orchestrator
    /// restarts it. Readiness fails at once either way.
    #[serde(with = "humantime_serde")]
    pub max_unhealthy: Duration,
}

impl Default for StoreSection {
    fn default() -> Self {
        Self {
            backend: "embedded".into(),
            path: PathBuf::from(DEFAULT_STATE_PATH),
            init_if_missing: false,
            max_unhealthy: Duration::from_secs(180),
        }
    }
}

/// `[layout]`: a preset, optionally with individual widths overridden.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LayoutSection {
    /// `twitter` (41/5/5/12 of 1 ms), `sonyflake` (39 bits of 10 ms, 8/8
    /// machine, 8 sequence) or `js53` (below 2^53).
    pub preset: String,
    /// RFC 3339 instant that time zero stands for.
    pub epoch: String,
    /// Length of one time unit (1 ms to 1 s); overrides the preset.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub time_unit: Option<Duration>,
    /// Width of the time field; overrides the preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_bits: Option<u8>,
    /// Width of the datacenter field; overrides the preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub datacenter_bits: Option<u8>,
    /// Width of the worker field; overrides the preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_bits: Option<u8>,
    /// Width of the sequence field; overrides the preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence_bits: Option<u8>,
}

impl LayoutSection {
    /// The preset name, with `+overrides` when individual widths or the
    /// time unit override it.
    pub fn preset_name(&self) -> String {
        let l = self;
        let overridden = l.time_unit.is_some()
            || l.time_bits.is_some()
            || l.datacenter_bits.is_some()
            || l.worker_bits.is_some()
            || l.sequence_bits.is_some();
        if overridden {
            format!("{}+overrides", l.preset)
        } else {
            l.preset.clone()
        }
    }
}

impl Default for LayoutSection {
    fn default() -> Self {
        Self {
            preset: "twitter".into(),
            epoch: "2024-01-01T00:00:00Z".into(),
            time_unit: None,
            time_bits: None,
            datacenter_bits: None,
            worker_bits: None,
            sequence_bits: None,
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
    /// Base URL of the local Consul agent.
    pub address: String,
    /// ACL token. Prefer `token_file` or `IDGEN_CONSUL__TOKEN`; never logged.
    pub token: String,
    /// File holding the ACL token (whitespace trimmed).
    pub token_file: PathBuf,
    /// KV prefix; keys live under `<prefix>/<cluster>/`.
    pub prefix: String,
    /// Cluster name: nodes sharing it share worker ids and marks.
    pub cluster: String,
    /// Consul service name.
    pub service: String,
    /// `auto` (claim the lowest free id, or the one this instance held) or
    /// `static` (claim exactly `node.worker_id`).
    pub worker: String,
    /// Session TTL of the worker lock.
    #[serde(with = "humantime_serde")]
    pub session_ttl: Duration,
    /// Lock-delay of the worker lock after its session is invalidated.
    #[serde(with = "humantime_serde")]
    pub lock_delay: Duration,
    /// Safety margin: the node stops issuing this long before its lease
    /// could run out on the server.
    #[serde(with = "humantime_serde")]
    pub lease_margin: Duration,
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
    /// lease was lost.
    #[serde(with = "humantime_serde")]
    pub reclaim_backoff_max: Duration,
}

impl Default for ConsulSection {
    fn default() -> Self {
        let lease = LeaseSettings::default();
        Self {
            address: "http://127.0.0.1:8500".into(),
            token: String::new(),
            token_file: PathBuf::new(),
            prefix: "idgen".into(),
            cluster: "default".into(),
            service: "idgen".into(),
            worker: "auto".into(),
            session_ttl: lease.ttl,
            lock_delay: lease.lock_delay,
            lease_margin: lease.margin,
            timeout: Duration::from_secs(2),
            retries: 2,
            check_interval: Duration::from_secs(5),
            check_timeout: Duration::from_secs(2),
            deregister_critical_after: Duration::from_secs(60),
            reclaim_backoff_max: Duration::from_secs(5),
        }
    }
}

impl std::fmt::Debug for ConsulSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulSection")
            .field("address", &self.address)
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
}

impl Default for LeaseSection {
    fn default() -> Self {
        Self {
            enabled: false,
            zone: 0,
            token: None,
            block: 1000,
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
}

impl Default for StrictSection {
    fn default() -> Self {
        Self {
            enabled: false,
            default_step: 1,
            max_keys_per_namespace: 100_000,
            max_namespaces: 100,
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
}

impl std::fmt::Debug for AdminSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminSection")
            .field("token", &(!self.token.is_empty()).then_some("<redacted>"))
            .field("token_file", &self.token_file)
            .finish()
    }
}

/// Reads a secret given inline or in a file (not both).
fn secret(
    inline: &str,
    file: &Path,
    key: &'static str,
    file_key: &'static str,
) -> Result<Option<String>, ConfigError> {
    match (inline.is_empty(), file.as_os_str().is_empty()) {
        (true, true) => Ok(None),
        (false, true) => Ok(Some(inline.to_owned())),
        (true, false) => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| invalid(file_key, format!("cannot read {}: {e}", file.display())))?;
            let token = text.trim();
            if token.is_empty() {
                return Err(invalid(file_key, format!("{} is empty", file.display())));
            }
            Ok(Some(token.to_owned()))
        }
        (false, false) => Err(invalid(key, format!("set {key} or {file_key}, not both"))),
    }
}

/// The admin token, redacted in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(pub String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// `[log]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSection {
    /// A tracing filter, e.g. `info` or `idgen=debug,info`. `RUST_LOG` wins.
    pub level: String,
    /// `text` or `json`.
    pub format: String,
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
            format: "text".into(),
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

    fn load_with_env_prefix(path: Option<&Path>, prefix: &str) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(FileConfig::default()));
        // systemd's StateDirectory= moves the default state file; the file,
        // the environment and --state still win over it.
        if let Some(dir) = state_directory(std::env::var_os("STATE_DIRECTORY"))? {
            fig = fig.merge(Serialized::default("store.path", dir.join(STATE_FILE_NAME)));
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
        check_environment(prefix, std::env::vars_os())?;
        fig = fig.merge(
            Env::prefixed(prefix)
                .filter(|key| key.as_str().contains("__"))
                .split("__"),
        );
        fig.extract().map_err(|e| ConfigError::Parse(e.to_string()))
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

/// `IDGEN_*` variables that are not config keys: read by the CLI (the
/// admin token of `idgen admin`) and by the test and bench scripts. Every
/// other `IDGEN_*` variable must name a key.
pub const NON_CONFIG_VARIABLES: &[&str] = &[
    "IDGEN_CONFIG",
    "IDGEN_ADMIN_TOKEN",
    "IDGEN_CHAOS_IDS",
    "IDGEN_BENCH_SECS",
    "IDGEN_BENCH_ROUNDS",
    "IDGEN_TEST_FAULT",
];

/// Refuses an environment variable under `prefix` that maps to no key,
/// naming the nearest valid one.
fn check_environment(
    prefix: &str,
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<(), ConfigError> {
    let keys = FileConfig::keys();
    for (name, _) in vars {
        let Some(name) = name.to_str() else {
            let lossy = name.to_string_lossy().into_owned();
            if lossy.starts_with(prefix) {
                return Err(ConfigError::Environment {
                    name: lossy,
                    problem: "is not valid UTF-8; unset it".into(),
                });
            }
            continue;
        };
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        if NON_CONFIG_VARIABLES.contains(&name) && prefix == "IDGEN_" {
            continue;
        }
        let wanted = rest.to_ascii_lowercase();
        let known = keys
            .iter()
            .any(|(section, key)| wanted == format!("{section}__{key}"));
        if known {
            continue;
        }
        let nearest = keys
            .iter()
            .min_by_key(|(section, key)| edit_distance(&wanted, &format!("{section}__{key}")));
        let problem = match nearest {
            Some((section, key)) => format!(
                "maps to no config key; did you mean {prefix}{}__{} ({section}.{key})? \
                 Variables are {prefix}<SECTION>__<KEY>, with two underscores between section and key",
                section.to_ascii_uppercase(),
                key.to_ascii_uppercase()
            ),
            None => "maps to no config key".into(),
        };
        return Err(ConfigError::Environment {
            name: name.to_owned(),
            problem,
        });
    }
    Ok(())
}

/// Refuses a duration outside `min..=max`, naming the key and the range.
fn check_duration(
    key: &'static str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(invalid(
            key,
            format!(
                "{} is out of range {}..={}",
                humantime::format_duration(value),
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(())
}

/// Levenshtein distance, for "did you mean" suggestions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Checks a tracing filter the way an operator means it: every directive is
/// a level (`info`) or `target=level` (`idgen=debug`). A bare word that is
/// not a level would parse as a target name and silence every log line,
/// errors included.
pub fn check_log_filter(filter: &str) -> Result<(), String> {
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    let is_level = |s: &str| LEVELS.contains(&s.trim().to_ascii_lowercase().as_str());
    let mut directives = 0;
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        directives += 1;
        let level = match directive.rsplit_once('=') {
            Some((target, level)) if !target.trim().is_empty() => level,
            Some(_) => return Err(format!("{directive:?} has no target before '='")),
            None => directive,
        };
        if !is_level(level) {
            return Err(format!(
                "{level:?} is not a log level; use trace, debug, info, warn, error or off, \
                 optionally per target (e.g. \"idgen=debug,info\")"
            ));
        }
    }
    if directives == 0 {
        return Err("is empty; use info (the default), or another level".into());
    }
    tracing_subscriber::EnvFilter::try_new(filter)
        .map(|_| ())
        .map_err(|e| format!("{filter:?} is not a valid filter: {e}"))
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

    /// The layout this file describes, validated against `now_ms`.
    pub fn layout(&self, now_ms: u64) -> Result<Layout, ConfigError> {
        let l = &self.layout;
        let preset =
            Preset::parse(&l.preset).map_err(|e| invalid("layout.preset", e.to_string()))?;
        let epoch = humantime::parse_rfc3339(&l.epoch).map_err(|e| {
            invalid(
                "layout.epoch",
                format!(
                    "{:?} is not an RFC 3339 UTC time like 2024-01-01T00:00:00Z: {e}",
                    l.epoch
                ),
            )
        })?;
        let epoch_ms = epoch
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| invalid("layout.epoch", "must not be before 1970"))?
            .as_millis() as u64;
        let mut spec: LayoutSpec = preset.spec(epoch_ms);
        if let Some(unit) = l.time_unit {
            let ms = unit.as_millis() as u64;
            if Duration::from_millis(ms) != unit {
                return Err(invalid(
                    "layout.time_unit",
                    "must be a whole number of milliseconds",
                ));
            }
            spec.time_unit_ms = ms;
        }
        spec.time_bits = l.time_bits.unwrap_or(spec.time_bits);
        spec.datacenter_bits = l.datacenter_bits.unwrap_or(spec.datacenter_bits);
        spec.worker_bits = l.worker_bits.unwrap_or(spec.worker_bits);
        spec.sequence_bits = l.sequence_bits.unwrap_or(spec.sequence_bits);
        spec.validate(now_ms)
            .map_err(|e| invalid("layout", e.to_string()))
    }

    /// The preset name, marked when individual widths override it.
    fn layout_preset_name(&self) -> String {
        self.layout.preset_name()
    }

    /// Validates everything and produces the runtime config.
    pub fn validate(&self, now_ms: u64) -> Result<Config, ConfigError> {
        let layout = self.layout(now_ms)?;
        layout
            .check_node(self.node.datacenter_id, 0)
            .map_err(|e| invalid("node.datacenter_id", e.to_string()))?;
        layout
            .check_node(0, self.node.worker_id)
            .map_err(|e| invalid("node.worker_id", e.to_string()))?;
        let grpc_listen = parse_addr("server.grpc_listen", &self.server.grpc_listen)?;
        let http_listen = parse_addr("server.http_listen", &self.server.http_listen)?;
        if grpc_listen == http_listen && grpc_listen.port() != 0 {
            return Err(invalid(
                "server.http_listen",
                "must differ from server.grpc_listen",
            ));
        }
        if !(1..=1_000_000).contains(&self.server.max_batch) {
            return Err(invalid("server.max_batch", "must be between 1 and 1000000"));
        }
        if !(1024..=16 << 20).contains(&self.server.max_request_size) {
            return Err(invalid(
                "server.max_request_size",
                "must be between 1024 and 16777216 bytes",
            ));
        }
        let connections = self.server.connections()?;
        let backend = match self.store.backend.as_str() {
            "embedded" => {
                if self.store.path.as_os_str().is_empty() {
                    return Err(invalid("store.path", "must not be empty"));
                }
                Backend::Embedded
            }
            "consul" => {
                let ttl_min = self.testing.consul_session_ttl_min;
                if ttl_min < Duration::from_secs(1) || ttl_min > CONSUL_SESSION_TTL_MIN {
                    return Err(invalid(
                        "testing.consul_session_ttl_min",
                        format!(
                            "{} is out of range 1s..=10s (a test-only setting; leave it out)",
                            humantime::format_duration(ttl_min)
                        ),
                    ));
                }
                Backend::Consul(Box::new(self.consul.validate(ttl_min)?))
            }
            other => {
                return Err(invalid(
                    "store.backend",
                    format!("unknown backend {other:?}; use embedded or consul"),
                ))
            }
        };
        let instance_id = match self.node.instance_id.as_str() {
            "" => None,
            id if is_name(id, 64, true) => Some(id.to_owned()),
            id => {
                return Err(invalid(
                    "node.instance_id",
                    format!("{id:?}: use 1 to 64 of a-z A-Z 0-9 . _ -"),
                ))
            }
        };
        let advertise = match self.node.advertise.as_str() {
            "" => None,
            text => {
                let addr = parse_addr("node.advertise", text)?;
                if addr.ip().is_unspecified() || addr.port() == 0 {
                    return Err(invalid(
                        "node.advertise",
                        format!("{addr} cannot be dialled; give the IP and port clients reach this node on"),
                    ));
                }
                Some(addr)
            }
        };
        let unit = Duration::from_millis(layout.time_unit_ms());
        // Upper bounds keep every duration far from overflow and sane.
        for (key, value, max) in [
            ("hwm.reserve", self.hwm.reserve, Duration::from_secs(3600)),
            (
                "hwm.renew_interval",
                self.hwm.renew_interval,
                Duration::from_secs(600),
            ),
            (
                "clock.max_backward",
                self.clock.max_backward,
                Duration::from_secs(3600),
            ),
            (
                "clock.max_startup_skew",
                self.clock.max_startup_skew,
                Duration::from_secs(86_400),
            ),
            (
                "server.max_wait",
                self.server.max_wait,
                Duration::from_secs(60),
            ),
            (
                "store.max_unhealthy",
                self.store.max_unhealthy,
                Duration::from_secs(86_400),
            ),
            (
                "server.shutdown_grace",
                self.server.shutdown_grace,
                Duration::from_secs(3600),
            ),
        ] {
            if value > max {
                return Err(invalid(
                    key,
                    format!(
                        "{} is too long; at most {}",
                        humantime::format_duration(value),
                        humantime::format_duration(max)
                    ),
                ));
            }
        }
        let h = &self.hwm;
        if h.renew_interval < Duration::from_millis(10) {
            return Err(invalid("hwm.renew_interval", "must be at least 10ms"));
        }
        if h.reserve < 2 * h.renew_interval {
            return Err(invalid(
                "hwm.reserve",
                format!(
                    "must be at least twice hwm.renew_interval ({}), or one slow write stops issuing",
                    humantime::format_duration(h.renew_interval)
                ),
            ));
        }
        let c = &self.clock;
        let min_backward =
            Duration::from_millis(2 * crate::id::snowflake::RACE_SLACK_MS).max(2 * unit);
        if c.max_backward < min_backward {
            return Err(invalid(
                "clock.max_backward",
                format!(
                    "must be at least {} (two time units, and above the {} ms by which racing threads' clock readings differ)",
                    humantime::format_duration(min_backward),
                    crate::id::snowflake::RACE_SLACK_MS
                ),
            ));
        }
        if c.max_startup_skew <= h.reserve {
            return Err(invalid(
                "clock.max_startup_skew",
                format!(
                    "must be larger than hwm.reserve ({}): after a crash the stored mark is up to that far ahead of a correct clock",
                    humantime::format_duration(h.reserve)
                ),
            ));
        }
        if self.store.max_unhealthy < Duration::from_secs(1) {
            return Err(invalid("store.max_unhealthy", "must be at least 1s"));
        }
        if self.server.max_wait < 2 * unit {
            return Err(invalid(
                "server.max_wait",
                "must be at least two layout time units",
            ));
        }
        check_log_filter(&self.log.level).map_err(|problem| invalid("log.level", problem))?;
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return Err(invalid(
                "log.format",
                format!("{:?}: use text or json", self.log.format),
            ));
        }
        let segment = if self.segment.enabled {
            let s = &self.segment;
            crate::id::segment::check_step(s.default_step)
                .map_err(|e| invalid("segment.default_step", e.to_string()))?;
            if s.max_step < s.default_step || s.max_step > crate::id::segment::MAX_STEP {
                return Err(invalid(
                    "segment.max_step",
                    format!(
                        "must be between segment.default_step ({}) and {}",
                        s.default_step,
                        crate::id::segment::MAX_STEP
                    ),
                ));
            }
            if s.max_tags == 0 {
                return Err(invalid(
                    "segment.max_tags",
                    "must be at least 1 (it bounds the live tags)".to_owned(),
                ));
            }
            if s.idle_release < Duration::from_secs(1) {
                return Err(invalid(
                    "segment.idle_release",
                    "must be at least 1s".to_owned(),
                ));
            }
            Some(self.segment.clone())
        } else {
            None
        };
        let lease = if self.lease.enabled {
            let l = &self.lease;
            crate::id::lease::check_zone(l.zone)
                .map_err(|e| invalid("lease.zone", e.to_string()))?;
            if let Some(token) = l.token {
                crate::id::lease::check_token(token)
                    .map_err(|e| invalid("lease.token", e.to_string()))?;
            }
            crate::id::lease::check_block(l.block)
                .map_err(|e| invalid("lease.block", e.to_string()))?;
            let mut l = l.clone();
            if matches!(backend, Backend::Embedded) {
                l.token = Some(self.embedded_lease_token(&layout, l.token)?);
            }
            Some(l)
        } else {
            None
        };
        let strict = if self.strict.enabled {
            crate::id::strict::check_step(self.strict.default_step)
                .map_err(|e| invalid("strict.default_step", e.to_string()))?;
            for (key, value) in [
                (
                    "strict.max_keys_per_namespace",
                    self.strict.max_keys_per_namespace,
                ),
                ("strict.max_namespaces", self.strict.max_namespaces),
            ] {
                if value == 0 {
                    return Err(invalid(key, "must be at least 1".to_owned()));
                }
            }
            Some(self.strict.clone())
        } else {
            None
        };
        let admin_token = secret(
            &self.admin.token,
            &self.admin.token_file,
            "admin.token",
            "admin.token_file",
        )?
        .map(AdminToken);
        Ok(Config {
            backend,
            segment,
            lease,
            strict,
            admin_token,
            instance_id,
            advertise,
            datacenter_id: self.node.datacenter_id,
            worker_id: self.node.worker_id,
            grpc_listen,
            http_listen,
            max_batch: self.server.max_batch,
            max_request_size: self.server.max_request_size as usize,
            max_wait: self.server.max_wait,
            shutdown_grace: self.server.shutdown_grace,
            connections,
            state_path: self.store.path.clone(),
            init_if_missing: self.store.init_if_missing,
            max_unhealthy: self.store.max_unhealthy,
            layout,
            layout_preset: self.layout_preset_name(),
            max_backward: c.max_backward,
            max_startup_skew: c.max_startup_skew,
            hwm_reserve: h.reserve,
            hwm_renew_interval: h.renew_interval,
            log_level: self.log.level.clone(),
            log_json: self.log.format == "json",
            log_color: self.log.color,
        })
    }
}

impl FileConfig {
    /// The token an embedded node starts lease mode at: the first of its
    /// own range, or `explicit` if that lies inside the range. Anything
    /// else would let two embedded nodes share a token space and hand out
    /// the same lease IDs, so it is refused.
    fn embedded_lease_token(
        &self,
        layout: &Layout,
        explicit: Option<u64>,
    ) -> Result<u64, ConfigError> {
        let spec = layout.spec();
        let (dc, worker) = (self.node.datacenter_id, self.node.worker_id);
        let Some((first, last)) =
            crate::id::lease::node_token_range(dc, worker, spec.datacenter_bits, spec.worker_bits)
        else {
            return Err(invalid(
                "lease.enabled",
                format!(
                    "lease mode on the embedded store gives every (datacenter, worker) its own range of the 65536 tokens, which needs layout datacenter_bits + worker_bits <= 16 (this layout has {} + {}); use store.backend = \"consul\" or a layout with fewer node bits",
                    spec.datacenter_bits, spec.worker_bits
                ),
            ));
        };
        match explicit {
            None => Ok(first),
            Some(t) if (first..=last).contains(&t) => Ok(t),
            Some(t) => {
                let owner =
                    crate::id::lease::token_owner(t, spec.datacenter_bits, spec.worker_bits)
                        .map(|(d, w)| format!(" (it belongs to datacenter {d}, worker {w})"))
                        .unwrap_or_default();
                Err(invalid(
                    "lease.token",
                    format!(
                        "token {t} is outside this node's own range {first} to {last} (derived from datacenter {dc}, worker {worker}){owner}: two embedded nodes using the same token hand out the same lease IDs. Remove lease.token to start at {first}, or pick a token from {first} to {last}"
                    ),
                ))
            }
        }
    }
}

impl ConsulSection {
    /// `session_ttl_min` is Consul's minimum session TTL (10 s unless a
    /// test lowers it through `[testing]`).
    fn validate(&self, session_ttl_min: Duration) -> Result<ClusterConfig, ConfigError> {
        let url = url::Url::parse(&self.address).map_err(|e| {
            invalid(
                "consul.address",
                format!(
                    "{:?} is not a URL like http://127.0.0.1:8500 ({e})",
                    self.address
                ),
            )
        })?;
        if url.scheme() != "http" || url.host().is_none() || url.path() != "/" {
            return Err(invalid(
                "consul.address",
                format!(
                    "{:?}: give the agent's plain http://host:port (HTTPS is not built in; use a local agent)",
                    self.address
                ),
            ));
        }
        let token = secret(
            &self.token,
            &self.token_file,
            "consul.token",
            "consul.token_file",
        )?;
        let prefix = self.prefix.trim_matches('/');
        if prefix.is_empty() || !prefix.split('/').all(|p| is_name(p, 64, false)) {
            return Err(invalid(
                "consul.prefix",
                format!("{:?}: use a-z 0-9 _ - segments separated by /", self.prefix),
            ));
        }
        if !is_name(&self.cluster, 64, false) {
            return Err(invalid(
                "consul.cluster",
                format!("{:?}: use 1 to 64 of a-z 0-9 _ -", self.cluster),
            ));
        }
        if !is_name(&self.service, 64, false) {
            return Err(invalid(
                "consul.service",
                format!("{:?}: use 1 to 64 of a-z 0-9 _ -", self.service),
            ));
        }
        let static_worker = match self.worker.as_str() {
            "auto" => false,
            "static" => true,
            other => {
                return Err(invalid(
                    "consul.worker",
                    format!("{other:?}: use auto (claim a free id) or static (node.worker_id)"),
                ))
            }
        };
        if self.session_ttl < session_ttl_min {
            let whose = if session_ttl_min == CONSUL_SESSION_TTL_MIN {
                "Consul's minimum session TTL (its session_ttl_min, 10s by default)".to_owned()
            } else {
                format!(
                    "the minimum {} set by testing.consul_session_ttl_min",
                    humantime::format_duration(session_ttl_min)
                )
            };
            return Err(invalid(
                "consul.session_ttl",
                format!(
                    "{} is below {whose}: Consul refuses to create such a session; use at least {}",
                    humantime::format_duration(self.session_ttl),
                    humantime::format_duration(session_ttl_min)
                ),
            ));
        }
        let lease = LeaseSettings {
            ttl: self.session_ttl,
            lock_delay: self.lock_delay,
            margin: self.lease_margin,
        };
        lease.check().map_err(|e| {
            let key = if e.starts_with("lock_delay") {
                "consul.lock_delay"
            } else if e.starts_with("margin") {
                "consul.lease_margin"
            } else {
                "consul.session_ttl"
            };
            invalid(key, e)
        })?;
        for (key, value, min, max) in [
            (
                "consul.timeout",
                self.timeout,
                Duration::from_millis(50),
                Duration::from_secs(60),
            ),
            (
                "consul.check_interval",
                self.check_interval,
                Duration::from_millis(100),
                Duration::from_secs(600),
            ),
            (
                "consul.check_timeout",
                self.check_timeout,
                Duration::from_millis(100),
                Duration::from_secs(600),
            ),
            (
                "consul.deregister_critical_after",
                self.deregister_critical_after,
                Duration::from_secs(1),
                Duration::from_secs(86_400),
            ),
            (
                "consul.reclaim_backoff_max",
                self.reclaim_backoff_max,
                Duration::from_millis(100),
                Duration::from_secs(600),
            ),
        ] {
            check_duration(key, value, min, max)?;
        }
        // A renew must be able to finish well inside the lease.
        if self.timeout > lease.ttl / 3 {
            return Err(invalid(
                "consul.timeout",
                format!(
                    "{} is too long for session_ttl {}: at most a third of the TTL",
                    humantime::format_duration(self.timeout),
                    humantime::format_duration(lease.ttl)
                ),
            ));
        }
        if self.retries > 10 {
            return Err(invalid("consul.retries", "at most 10"));
        }
        Ok(ClusterConfig {
            client: ConsulConfig {
                address: self.address.trim_end_matches('/').to_owned(),
                token,
                timeout: self.timeout,
                retries: self.retries,
                ..ConsulConfig::default()
            },
            keys: ClusterKeys::new(prefix, &self.cluster),
            service: self.service.clone(),
            static_worker,
            lease,
            check_interval: self.check_interval,
            check_timeout: self.check_timeout,
            deregister_after: self.deregister_critical_after,
            reclaim_backoff_max: self.reclaim_backoff_max,
        })
    }
}

/// `s` is 1..=`max` characters of `a-z 0-9 _ -` (plus `A-Z .` if `loose`).
fn is_name(s: &str, max: usize, loose: bool) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || b == b'_'
                || b == b'-'
                || (loose && (b.is_ascii_uppercase() || b == b'.'))
        })
}

fn parse_addr(key: &'static str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse().map_err(|e| {
        invalid(
            key,
            format!("{value:?} is not an IP:port address like 127.0.0.1:50051 ({e})"),
        )
    })
}

/// Where durable state lives.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The local state file ([`Config::state_path`]); worker id from config.
    Embedded,
    /// Consul: claimed worker ids, marks in KV, service registration.
    Consul(Box<ClusterConfig>),
}

/// The validated `[consul]` section.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// How to reach the agent (address, token, timeouts).
    pub client: ConsulConfig,
    /// `<prefix>/<cluster>/`.
    pub keys: ClusterKeys,
    /// Consul service name.
    pub service: String,
    /// Claim exactly `node.worker_id` instead of any free id.
    pub static_worker: bool,
    /// Worker lock timing.
    pub lease: LeaseSettings,
    /// gRPC health probe interval.
    pub check_interval: Duration,
    /// gRPC health probe timeout.
    pub check_timeout: Duration,
    /// `DeregisterCriticalServiceAfter`.
    pub deregister_after: Duration,
    /// Longest pause between claim attempts after the lease was lost.
    pub reclaim_backoff_max: Duration,
}

/// The validated runtime configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where durable state lives.
    pub backend: Backend,
    /// Segment mode settings, when enabled.
    pub segment: Option<SegmentSection>,
    /// Lease mode settings, when enabled.
    pub lease: Option<LeaseSection>,
    /// Strict mode settings, when enabled.
    pub strict: Option<StrictSection>,
    /// The admin API token; `None`: admin calls are refused.
    pub admin_token: Option<AdminToken>,
    /// Stable instance name; `None`: derived from the host name and port.
    pub instance_id: Option<String>,
    /// The gRPC address to advertise; `None`: the bound listener's.
    pub advertise: Option<SocketAddr>,
    /// Datacenter id.
    pub datacenter_id: u64,
    /// Worker id.
    pub worker_id: u64,
    /// gRPC listen address.
    pub grpc_listen: SocketAddr,
    /// HTTP listen address.
    pub http_listen: SocketAddr,
    /// Largest GenIds `count`.
    pub max_batch: u32,
    /// Largest gRPC request message, in bytes.
    pub max_request_size: usize,
    /// Longest wait for a free sequence within one call.
    pub max_wait: Duration,
    /// How long shutdown waits for in-flight calls.
    pub shutdown_grace: Duration,
    /// Bounds on client connections, both ports.
    pub connections: ConnectionSettings,
    /// Embedded state file.
    pub state_path: PathBuf,
    /// Create the state file if missing (development only).
    pub init_if_missing: bool,
    /// How long the node may be unable to issue (store cannot write, or
    /// fenced) before `/healthz` fails.
    pub max_unhealthy: Duration,
    /// The ID layout.
    pub layout: Layout,
    /// The layout's preset name as configured (`twitter`, ...), with
    /// `+overrides` when widths or the time unit were set by hand; recorded
    /// with the layout in Consul for operators.
    pub layout_preset: String,
    /// Largest tolerated clock step back.
    pub max_backward: Duration,
    /// Largest start-up lag behind the stored high-water mark.
    pub max_startup_skew: Duration,
    /// How far ahead the high-water mark is kept.
    pub hwm_reserve: Duration,
    /// How often it is extended.
    pub hwm_renew_interval: Duration,
    /// Log filter.
    pub log_level: String,
    /// JSON logs instead of text.
    pub log_json: bool,
    /// Colour codes in text logs.
    pub log_color: LogColor,
}

impl Config {
    /// Loads, overrides and validates in one go.
    pub fn load(
        path: Option<&Path>,
        overrides: &Overrides,
        now_ms: u64,
    ) -> Result<Self, ConfigError> {
        let mut file = FileConfig::load(path)?;
        file.apply(overrides);
        file.validate(now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_790_000_000_000;

    #[test]
    fn defaults_are_valid() {
        let c = FileConfig::default().validate(NOW).unwrap();
        assert_eq!(c.max_batch, 10_000);
        assert_eq!(c.layout.spec().sequence_bits, 12);
        assert_eq!(c.hwm_reserve, Duration::from_secs(3));
        assert_eq!(c.max_backward, Duration::from_secs(1));
        assert_eq!(c.max_startup_skew, Duration::from_secs(10));
    }

    #[test]
    fn store_max_unhealthy_defaults_to_three_minutes_and_is_bounded() {
        let c = FileConfig::default().validate(NOW).unwrap();
        assert_eq!(c.max_unhealthy, Duration::from_secs(180));
        let mut f = FileConfig::default();
        f.store.max_unhealthy = Duration::from_millis(500);
        assert_eq!(err_key(&f), "store.max_unhealthy");
        f.store.max_unhealthy = Duration::from_secs(2 * 86_400);
        assert_eq!(err_key(&f), "store.max_unhealthy");
        f.store.max_unhealthy = Duration::from_secs(1);
        assert_eq!(
            f.validate(NOW).unwrap().max_unhealthy,
            Duration::from_secs(1)
        );
    }

    fn err_key(f: &FileConfig) -> String {
        match f.validate(NOW) {
            Err(ConfigError::Invalid { key, .. }) => key.to_owned(),
            other => panic!("expected an invalid key, got {other:?}"),
        }
    }

    #[test]
    fn mode_sections_are_checked_and_the_admin_token_is_never_printed() {
        let mut f = FileConfig::default();
        f.lease.enabled = true;
        f.lease.zone = 128;
        assert_eq!(err_key(&f), "lease.zone");
        f.lease.zone = 127;
        f.lease.token = Some(65_536);
        assert_eq!(err_key(&f), "lease.token");
        f.lease.token = Some(63);
        f.lease.block = 0;
        assert_eq!(err_key(&f), "lease.block");
        f.lease.block = 1000;
        let c = f.validate(NOW).unwrap();
        assert_eq!(c.lease.map(|l| (l.zone, l.token)), Some((127, Some(63))));

        // Embedded nodes derive their token range from (datacenter,
        // worker) and refuse a token of another node's range.
        let mut f = FileConfig::default();
        f.lease.enabled = true;
        f.node.datacenter_id = 1;
        f.node.worker_id = 2;
        let c = f.validate(NOW).unwrap();
        assert_eq!(c.lease.as_ref().and_then(|l| l.token), Some(2048 + 128));
        f.lease.token = Some(0);
        let err = f.validate(NOW).unwrap_err().to_string();
        assert!(
            err.contains("lease.token") && err.contains("2176 to 2239"),
            "{err}"
        );
        assert!(err.contains("belongs to datacenter 0, worker 0"), "{err}");
        f.lease.token = Some(2239);
        assert_eq!(
            f.validate(NOW).unwrap().lease.and_then(|l| l.token),
            Some(2239)
        );

        let mut f = FileConfig::default();
        f.strict.enabled = true;
        f.strict.default_step = 0;
        assert_eq!(err_key(&f), "strict.default_step");
        f.strict.default_step = 1_000_001;
        assert_eq!(err_key(&f), "strict.default_step");
        // Disabled sections are not checked.
        f.strict.enabled = false;
        assert!(f.validate(NOW).unwrap().strict.is_none());

        let mut f = FileConfig::default();
        assert!(f.validate(NOW).unwrap().admin_token.is_none());
        f.admin.token = "s3cret-admin".into();
        f.admin.token_file = "/tmp/whatever".into();
        assert_eq!(err_key(&f), "admin.token");
        f.admin.token_file = PathBuf::new();
        let c = f.validate(NOW).unwrap();
        assert_eq!(c.admin_token, Some(AdminToken("s3cret-admin".into())));
        assert!(!format!("{c:?} {f:?}").contains("s3cret-admin"));
        f.admin.token = String::new();
        f.admin.token_file = "/nonexistent/idgen-admin-token".into();
        assert_eq!(err_key(&f), "admin.token_file");
    }

    #[test]
    fn errors_name_the_key() {
        let mut f = FileConfig::default();
        f.server.grpc_listen = "localhost".into();
        assert_eq!(err_key(&f), "server.grpc_listen");
        let mut f = FileConfig::default();
        f.node.worker_id = 32;
        assert_eq!(err_key(&f), "node.worker_id");
        let mut f = FileConfig::default();
        f.layout.preset = "snowflake".into();
        assert_eq!(err_key(&f), "layout.preset");
        let mut f = FileConfig::default();
        f.layout.time_bits = Some(45);
        assert_eq!(err_key(&f), "layout");
        let mut f = FileConfig::default();
        f.layout.epoch = "yesterday".into();
        assert_eq!(err_key(&f), "layout.epoch");
        let mut f = FileConfig::default();
        f.hwm.reserve = Duration::from_millis(1500);
        assert_eq!(err_key(&f), "hwm.reserve");
        let mut f = FileConfig::default();
        f.clock.max_startup_skew = Duration::from_secs(2);
        assert_eq!(err_key(&f), "clock.max_startup_skew");
        let mut f = FileConfig::default();
        f.clock.max_backward = Duration::from_millis(5);
        assert_eq!(err_key(&f), "clock.max_backward");
        let mut f = FileConfig::default();
        f.hwm.reserve = Duration::from_secs(u64::MAX / 2);
        assert_eq!(err_key(&f), "hwm.reserve");
        let mut f = FileConfig::default();
        f.server.max_batch = 0;
        assert_eq!(err_key(&f), "server.max_batch");
        let mut f = FileConfig::default();
        f.store.backend = "etcd".into();
        assert_eq!(err_key(&f), "store.backend");
    }

    #[test]
    fn consul_section_is_checked_key_by_key() {
        let consul = || {
            let mut f = FileConfig::default();
            f.store.backend = "consul".into();
            f
        };
        let c = consul().validate(NOW).unwrap();
        let Backend::Consul(cluster) = &c.backend else {
            panic!("consul backend expected");
        };
        assert_eq!(cluster.lease.ttl, Duration::from_secs(15));
        assert!(!cluster.static_worker);
        assert_eq!(cluster.client.token, None);
        type Edit = fn(&mut FileConfig);
        let cases: [(Edit, &str); 11] = [
            (
                |f| f.consul.address = "127.0.0.1:8500".into(),
                "consul.address",
            ),
            (
                |f| f.consul.address = "https://consul:8501".into(),
                "consul.address",
            ),
            (|f| f.consul.cluster = "Prod!".into(), "consul.cluster"),
            (|f| f.consul.prefix = "/".into(), "consul.prefix"),
            (|f| f.consul.worker = "dynamic".into(), "consul.worker"),
            (
                |f| f.consul.session_ttl = Duration::from_millis(1500),
                "consul.session_ttl",
            ),
            (
                |f| f.consul.lease_margin = Duration::from_secs(8),
                "consul.lease_margin",
            ),
            (
                |f| f.consul.lock_delay = Duration::from_secs(61),
                "consul.lock_delay",
            ),
            (
                |f| f.consul.timeout = Duration::from_secs(6),
                "consul.timeout",
            ),
            (|f| f.node.instance_id = "a b".into(), "node.instance_id"),
            (
                |f| f.node.advertise = "0.0.0.0:50051".into(),
                "node.advertise",
            ),
        ];
        for (edit, key) in cases {
            let mut f = consul();
            edit(&mut f);
            assert_eq!(err_key(&f), key);
        }
        // Consul's 10 s minimum, named in the message; the test-only
        // setting lowers it, within 1 s..=10 s.
        let mut f = consul();
        f.consul.session_ttl = Duration::from_secs(9);
        let msg = f.validate(NOW).unwrap_err().to_string();
        assert!(msg.contains("consul.session_ttl"), "{msg}");
        assert!(msg.contains("Consul's minimum session TTL"), "{msg}");
        assert!(msg.contains("10s"), "{msg}");
        f.consul.session_ttl = Duration::from_secs(10);
        f.consul.lease_margin = Duration::from_secs(2);
        f.validate(NOW).unwrap();
        f.consul.session_ttl = Duration::from_secs(2);
        f.consul.lock_delay = Duration::from_secs(2);
        f.consul.lease_margin = Duration::from_millis(800);
        f.consul.timeout = Duration::from_millis(500);
        assert_eq!(err_key(&f), "consul.session_ttl");
        f.testing.consul_session_ttl_min = Duration::from_secs(1);
        f.validate(NOW).unwrap();
        f.consul.session_ttl = Duration::from_secs(1);
        f.testing.consul_session_ttl_min = Duration::from_secs(2);
        let msg = f.validate(NOW).unwrap_err().to_string();
        assert!(msg.contains("testing.consul_session_ttl_min"), "{msg}");
        for bad in [Duration::from_millis(500), Duration::from_secs(11)] {
            f.testing.consul_session_ttl_min = bad;
            assert_eq!(err_key(&f), "testing.consul_session_ttl_min");
        }
        let mut f = consul();
        f.consul.token = "t".into();
        f.consul.token_file = "/tmp/t".into();
        assert_eq!(err_key(&f), "consul.token");
        let mut f = consul();
        f.consul.token_file = "/nonexistent/idgen-token".into();
        assert_eq!(err_key(&f), "consul.token_file");
        // The token is read from the file and never shown.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  s3cret\n").unwrap();
        let mut f = consul();
        f.consul.token_file = path;
        f.consul.worker = "static".into();
        f.node.worker_id = 4;
        let c = f.validate(NOW).unwrap();
        let Backend::Consul(cluster) = &c.backend else {
            panic!("consul backend expected");
        };
        assert_eq!(cluster.client.token.as_deref(), Some("s3cret"));
        assert!(cluster.static_worker);
        assert!(!format!("{c:?}").contains("s3cret"));
        f.consul.token = "inline-secret".into();
        f.consul.token_file = PathBuf::new();
        assert!(!format!("{f:?}").contains("inline-secret"));
    }

    #[test]
    fn state_directory_takes_the_first_absolute_entry_and_refuses_a_relative_one() {
        use std::ffi::OsString;
        let dir = |v: &str| state_directory(Some(OsString::from(v)));
        assert_eq!(state_directory(None).unwrap(), None);
        assert_eq!(dir("").unwrap(), None);
        assert_eq!(
            dir("/var/lib/idgen").unwrap(),
            Some(PathBuf::from("/var/lib/idgen"))
        );
        assert_eq!(
            dir("/var/lib/idgen:/var/lib/other").unwrap(),
            Some(PathBuf::from("/var/lib/idgen"))
        );
        let e = dir("idgen").unwrap_err().to_string();
        assert!(
            e.contains("STATE_DIRECTORY") && e.contains("absolute"),
            "{e}"
        );
        assert!(Path::new(DEFAULT_STATE_PATH).is_absolute());
    }

    #[test]
    fn the_example_config_lists_every_default() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/idgen.example.toml");
        let f = FileConfig::load_with_env_prefix(Some(&path), "IDGEN_EXAMPLE_UNUSED_").unwrap();
        f.validate(NOW).unwrap();
        assert_eq!(
            serde_json::to_value(&f).unwrap(),
            serde_json::to_value(FileConfig::default()).unwrap()
        );
        // Every key is written out, except the test-only [testing] section,
        // which must stay out of the example.
        let written: serde_json::Value =
            figment::Figment::from(figment::providers::Toml::file(&path))
                .extract()
                .unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let mut out = Vec::new();
            for (section, table) in v.as_object().into_iter().flatten() {
                for key in table.as_object().into_iter().flatten().map(|(k, _)| k) {
                    out.push(format!("{section}.{key}"));
                }
            }
            out.sort();
            out
        };
        let mut defaults = serde_json::to_value(FileConfig::default()).unwrap();
        defaults.as_object_mut().unwrap().remove("testing");
        assert_eq!(keys(&written), keys(&defaults));
        assert!(written.get("testing").is_none());
    }

    #[test]
    fn connection_bounds_are_checked_and_name_their_key() {
        let c = FileConfig::default().validate(NOW).unwrap().connections;
        assert_eq!(c.grpc_max_connections, 768);
        assert_eq!(c.header_timeout, Duration::from_secs(10));
        type Break = fn(&mut ServerSection);
        let cases: [(&str, Break); 6] = [
            ("server.grpc_max_connections", |s| {
                s.grpc_max_connections = 0
            }),
            ("server.http_max_connections", |s| {
                s.http_max_connections = 2_000_000
            }),
            ("server.header_timeout", |s| {
                s.header_timeout = Duration::from_millis(10)
            }),
            ("server.grpc_keepalive_timeout", |s| {
                s.grpc_keepalive_timeout = Duration::from_secs(3600)
            }),
            ("server.grpc_max_concurrent_streams", |s| {
                s.grpc_max_concurrent_streams = 0
            }),
            ("server.max_header_size", |s| s.max_header_size = 100),
        ];
        for (key, break_it) in cases {
            let mut f = FileConfig::default();
            break_it(&mut f.server);
            assert_eq!(err_key(&f), key);
        }
    }

    #[test]
    fn files_and_overrides_layer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[node]\nworker_id = 3\n[layout]\npreset = \"sonyflake\"\n[hwm]\nreserve = \"5s\"\n",
        )
        .unwrap();
        let o = Overrides {
            worker_id: Some(4),
            ..Overrides::default()
        };
        let c = Config::load(Some(&path), &o, NOW).unwrap();
        assert_eq!(c.worker_id, 4);
        assert_eq!(c.layout.time_unit_ms(), 10);
        assert_eq!(c.hwm_reserve, Duration::from_secs(5));
    }

    #[test]
    fn environment_overrides_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[node]\nworker_id = 3\n").unwrap();
        // A prefix of its own, so no other test or shell variable interferes.
        std::env::set_var("IDGENCFGTEST_NODE__WORKER_ID", "7");
        std::env::set_var("IDGENCFGTEST_HWM__RESERVE", "4s");
        let f = FileConfig::load_with_env_prefix(Some(&path), "IDGENCFGTEST_").unwrap();
        assert_eq!(f.node.worker_id, 7);
        assert_eq!(f.hwm.reserve, Duration::from_secs(4));
        std::env::set_var("IDGENCFGTEST_NODE__WORKER_ID", "seven");
        let err = FileConfig::load_with_env_prefix(Some(&path), "IDGENCFGTEST_").unwrap_err();
        assert!(
            err.to_string().to_lowercase().contains("worker_id"),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_and_missing_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[node]\nworkerid = 3\n").unwrap();
        let msg = FileConfig::load(Some(&path)).unwrap_err().to_string();
        assert!(msg.contains("workerid"), "{msg}");
        let missing = dir.path().join("nope.toml");
        assert!(FileConfig::load(Some(&missing)).is_err());
    }

    fn vars(names: &[&str]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        names.iter().map(|n| (n.into(), "1".into())).collect()
    }

    #[test]
    fn an_environment_variable_that_names_no_key_is_refused_with_the_nearest_key() {
        // One underscore instead of two: the old build ran as worker 0.
        let err = check_environment("IDGEN_", vars(&["IDGEN_NODE_WORKER_ID"])).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("IDGEN_NODE_WORKER_ID maps to no config key"),
            "{msg}"
        );
        assert!(
            msg.contains("IDGEN_NODE__WORKER_ID (node.worker_id)"),
            "{msg}"
        );
        let msg = check_environment("IDGEN_", vars(&["IDGEN_HWM__RESERV"]))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("IDGEN_HWM__RESERVE (hwm.reserve)"), "{msg}");
        let msg = check_environment("IDGEN_", vars(&["IDGEN_NOPE__WORKER_ID"]))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("node.worker_id"), "{msg}");
    }

    #[test]
    fn every_key_and_the_cli_variables_are_accepted_and_other_prefixes_ignored() {
        let mut names: Vec<String> = FileConfig::keys()
            .iter()
            .map(|(s, k)| format!("IDGEN_{}__{}", s.to_uppercase(), k.to_uppercase()))
            .collect();
        assert!(names.contains(&"IDGEN_LAYOUT__SEQUENCE_BITS".to_string()));
        assert!(names.contains(&"IDGEN_CONSUL__TOKEN".to_string()));
        names.extend(NON_CONFIG_VARIABLES.iter().map(|s| s.to_string()));
        names.extend([
            "IDGENX".into(),
            "PATH".into(),
            "XIDGEN_NODE_WORKER_ID".into(),
        ]);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        check_environment("IDGEN_", vars(&refs)).unwrap();
    }

    #[test]
    fn log_levels_must_be_levels_or_target_directives() {
        for ok in [
            "info",
            "WARN",
            "idgen=debug,info",
            "off",
            "idgen::server=trace",
        ] {
            check_log_filter(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in ["verbose", "warning", "", " , ", "idgen=loud", "=debug"] {
            assert!(check_log_filter(bad).is_err(), "{bad:?} was accepted");
        }
        let mut f = FileConfig::default();
        f.log.level = "verbose".into();
        let msg = f.validate(NOW).unwrap_err().to_string();
        assert!(
            msg.contains("log.level") && msg.contains("verbose"),
            "{msg}"
        );
    }

    #[test]
    fn check_config_output_redacts_secrets_and_reads_back() {
        let mut f = FileConfig::default();
        f.admin.token = "inline-admin-secret".into();
        f.consul.token = "inline-consul-secret".into();
        f.node.worker_id = 9;
        let text = f.redacted_toml().unwrap();
        assert!(!text.contains("inline-admin-secret"), "{text}");
        assert!(!text.contains("inline-consul-secret"), "{text}");
        assert!(text.contains("<redacted>"), "{text}");
        let back: FileConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.node.worker_id, 9);
    }
}
