//! Configuration in two layers: [`FileConfig`] (in `file.rs`) is what a
//! TOML file and `IDGEN_...` environment variables say, with defaults and
//! human-readable durations; [`Config`] is the validated runtime form the
//! server uses, one typed settings value per section. `validate.rs` holds
//! the checks, each section validating itself into its settings type.
//!
//! Precedence, lowest first: built-in defaults, the TOML file, environment
//! variables (`IDGEN_SECTION__KEY`, e.g. `IDGEN_NODE__WORKER_ID=3`), CLI flags.
//! `config/idgen.example.toml` documents every key.

mod allow;
mod cors;
mod environment;
mod file;
mod hide;
mod layout;
mod validate;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

pub use crate::cluster::settings::ClusterConfig;
use crate::id::Layout;
use crate::store::hwm::HwmSettings;

pub use allow::{AllowList, Cidr};
pub use cors::CorsOrigins;
pub use environment::{expand_path, CREDENTIALS_DIRECTORY, NON_CONFIG_VARIABLES};
pub use file::{
    state_directory, AdminSection, BackendKind, ClockSection, ConsulSection, FileConfig,
    FormattedSection, HttpSection, HwmSection, LayoutSection, LeaseSection, LogColor, LogFormat,
    LogSection, NodeSection, Overrides, SegmentSection, ServerSection, StoreSection, StrictSection,
    TestingSection, TlsSection, WorkerClaim, CONSUL_SESSION_TTL_MIN, DEFAULT_STATE_PATH,
    STATE_FILE_NAME,
};
pub use hide::{HideSection, HideSettings, LoadedMasterKey};
pub use layout::{LayoutHide, DEFAULT_HIDE_VERSION_BITS};
pub use validate::check_log_filter;

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

/// The validated runtime configuration, one settings value per section.
#[derive(Debug, Clone)]
pub struct Config {
    /// `[node]`: this node's place in the layout and how it is reached.
    pub node: NodeSettings,
    /// `[server]`: listeners, request limits, connection bounds.
    pub server: ServerSettings,
    /// `[store]` (and `[consul]` with the Consul backend).
    pub store: StoreSettings,
    /// `[layout]`: the ID layout.
    pub layout: Layout,
    /// The layout's preset name as configured (`twitter`, ...), with
    /// `+overrides` when widths or the time unit were set by hand; recorded
    /// with the layout in Consul for operators.
    pub layout_preset: String,
    /// `layout.hide`: how snowflake IDs are hidden, if they are.
    pub layout_hide: Option<LayoutHide>,
    /// `[hwm]` and `[clock]`: what the high-water mark keeper takes. The
    /// clock limits live here because the keeper is what enforces them
    /// (at start-up against the stored mark, and on every step back).
    pub hwm: HwmSettings,
    /// `[segment]`, when enabled.
    pub segment: Option<SegmentModeSettings>,
    /// `[lease]`, when enabled.
    pub lease: Option<LeaseModeSettings>,
    /// `[strict]`, when enabled.
    pub strict: Option<StrictModeSettings>,
    /// `[formatted]` and `[[formats]]` (no formats: the mode serves none).
    pub formatted: FormattedSettings,
    /// `[admin]`: the admin API.
    pub admin: AdminSettings,
    /// `[log]`.
    pub log: LogSettings,
    /// `[hide]`: where the hide master key comes from.
    pub hide: HideSettings,
}

impl Config {
    /// The layout the snowflake generator composes IDs under: the
    /// effective (internal) layout of a hidden layout, else `layout`.
    /// Time left, start-up and exhaustion checks use this one.
    pub fn generator_layout(&self) -> Layout {
        self.layout_hide
            .as_ref()
            .map_or(self.layout, |h| h.internal)
    }

    /// The layout as the state file records it: `layout` as text, plus
    /// the hiding when set (so switching it is a layout change).
    pub fn layout_record(&self) -> String {
        layout_record(&self.layout, self.layout_hide.as_ref())
    }

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

/// The state file's layout text for `layout` hidden by `hide`: the plain
/// layout's text is unchanged, so existing state files still match.
pub fn layout_record(layout: &Layout, hide: Option<&LayoutHide>) -> String {
    match hide {
        None => layout.to_string(),
        Some(h) => format!("{layout} / hide {}", h.record_text()),
    }
}

/// The validated `[node]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSettings {
    /// Datacenter id (fits the layout).
    pub datacenter_id: u64,
    /// Worker id (fits the layout; with Consul, used only by a static
    /// claim).
    pub worker_id: u64,
    /// Stable instance name; `None`: derived from the host name and port.
    pub instance_id: Option<String>,
    /// The gRPC address to advertise; `None`: the bound listener's.
    pub advertise: Option<SocketAddr>,
}

/// The validated `[server]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
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
    /// TLS on both ports; `None`: plaintext.
    pub tls: Option<TlsSettings>,
    /// Peers allowed on both ports (`server.allow`); empty: all.
    pub allow: AllowList,
    /// Web origins a browser may call the HTTP API's `/v1/` from
    /// (`server.http.cors_allow_origins`).
    pub cors: CorsOrigins,
    /// Plaintext was allowed on a non-loopback address
    /// (`server.insecure = true`); the node warns at start.
    pub insecure: bool,
}

/// The validated `[server.tls]` section: where the PEM files are. They are
/// read (and checked) when the node starts, and again when they change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// Certificate chain, PEM.
    pub cert: PathBuf,
    /// Private key, PEM.
    pub key: PathBuf,
    /// CA for client certificates; `None`: none asked for.
    pub client_ca: Option<PathBuf>,
    /// Every client must present a certificate from `client_ca`.
    pub client_required: bool,
}

/// Bounds on client connections (validated from `[server]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionSettings {
    /// Most open gRPC connections.
    pub grpc_max_connections: usize,
    /// Most open HTTP connections.
    pub http_max_connections: usize,
    /// Most open connections from one peer (IPv4 address or IPv6 /64), on
    /// each port.
    pub max_connections_per_peer: usize,
    /// HTTP/2 preface and HTTP/1 request header deadline.
    pub header_timeout: Duration,
    /// Deadline from a call's headers to its complete request.
    pub request_body_timeout: Duration,
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

/// The validated `[store]` section.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// Where durable state lives.
    pub backend: Backend,
    /// How long the node may be unable to issue (store cannot write, or
    /// fenced) before `/healthz` fails. Read on either backend, so it sits
    /// beside the backend rather than in it.
    pub max_unhealthy: Duration,
}

impl StoreSettings {
    /// The embedded state file, or `None` with the Consul backend.
    pub fn state_path(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Embedded { path, .. } => Some(path),
            Backend::Consul(_) => None,
        }
    }

    /// The embedded state file's mirror (`store.mirror_path`), if set.
    pub fn mirror_path(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Embedded { mirror_path, .. } => mirror_path.as_deref(),
            Backend::Consul(_) => None,
        }
    }
}

/// Where durable state lives.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The local state file; the worker id comes from config.
    Embedded {
        /// Path of the state file.
        path: PathBuf,
        /// Create the state file if missing (development only).
        init_if_missing: bool,
        /// Where the node keeps a current copy of the state file, if set
        /// (`store.mirror_path`).
        mirror_path: Option<PathBuf>,
    },
    /// Consul: claimed worker ids, marks in KV, service registration.
    Consul(Box<ClusterConfig>),
}

/// The validated `[segment]` section (segment mode is on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentModeSettings {
    /// Create an unknown tag on first use (with `default_step`).
    pub auto_create: bool,
    /// Step of auto-created tags.
    pub default_step: u64,
    /// Cap of the dynamic step.
    pub max_step: u64,
    /// Most live tags.
    pub max_tags: u64,
    /// A tag unused on this node for this long has its buffers dropped.
    pub idle_release: Duration,
}

/// The validated `[lease]` section (lease mode is on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseModeSettings {
    /// Zone, the top field of every lease ID.
    pub zone: u64,
    /// The token to start at. Always set on the embedded store (the first
    /// of this node's own range unless configured inside it); ignored
    /// with Consul, which claims tokens.
    pub token: Option<u64>,
    /// Sequences reserved per block.
    pub block: u64,
    /// `[lease.hide]`: the zone's IDs shown through a hide key.
    pub hide: Option<crate::id::lease::ZoneHide>,
}

impl LeaseModeSettings {
    /// The zone's largest token: lower for a hidden zone, whose key
    /// version takes the top of the token field.
    pub fn max_token(&self) -> u64 {
        self.hide.as_ref().map_or(
            crate::id::lease::MAX_TOKEN,
            crate::id::lease::ZoneHide::max_token,
        )
    }

    /// Token bits of the zone (16, fewer when hidden).
    pub fn token_bits(&self) -> u32 {
        self.hide.as_ref().map_or(
            crate::id::lease::TOKEN_BITS,
            crate::id::lease::ZoneHide::token_bits,
        )
    }
}

/// The validated `[formatted]` section and `[[formats]]` (each compiled
/// at validation, so a broken format stops the start; a Lua rule's checks
/// run when the entry is first stored, `modes::format_catalog`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormattedSettings {
    /// Counter values reserved per durable write.
    pub block: u64,
    /// The formats served.
    pub formats: Vec<crate::id::format::FormatDef>,
    /// How long one Lua `create_id` call may run.
    pub lua_deadline: Duration,
    /// Threads Lua rules run on.
    pub lua_workers: usize,
    /// How long loading one Lua rule, its checks included, may take.
    pub lua_check_budget: Duration,
    /// Most counters one format keeps (`formatted.max_scope_values`).
    pub max_scope_values: u64,
}

impl Default for FormattedSettings {
    /// What an empty `[formatted]` section gives.
    fn default() -> Self {
        let file = file::FormattedSection::default();
        Self {
            block: file.block,
            formats: Vec::new(),
            lua_deadline: file.lua_deadline,
            lua_workers: file.lua_workers,
            lua_check_budget: file.lua_check_budget,
            max_scope_values: file.max_scope_values,
        }
    }
}

/// The validated `[strict]` section (strict mode is on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrictModeSettings {
    /// Step of namespaces without one set by the admin API.
    pub default_step: u64,
    /// Most live keys in one namespace.
    pub max_keys_per_namespace: u64,
    /// Most namespaces with live keys.
    pub max_namespaces: u64,
}

/// The defaults of `[segment]`, for tests and tools that build a
/// [`Config`] by hand.
impl Default for SegmentModeSettings {
    fn default() -> Self {
        SegmentSection::default().settings()
    }
}

/// The defaults of `[lease]`.
impl Default for LeaseModeSettings {
    fn default() -> Self {
        LeaseSection::default().settings()
    }
}

/// The defaults of `[strict]`.
impl Default for StrictModeSettings {
    fn default() -> Self {
        StrictSection::default().settings()
    }
}

/// The validated `[admin]` section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminSettings {
    /// The admin API token; `None`: admin calls are refused.
    pub token: Option<AdminToken>,
    /// Client certificate names allowed to administer; empty: no
    /// certificate needed.
    pub client_cert_names: Vec<String>,
    /// Peers allowed to make admin calls (`admin.allow`); empty: all.
    pub allow: AllowList,
}

/// The admin token, redacted in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(pub String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// The validated `[log]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// A tracing filter (`RUST_LOG` wins when set).
    pub level: String,
    /// Text or JSON lines.
    pub format: LogFormat,
    /// Colour codes in text logs.
    pub color: LogColor,
}
