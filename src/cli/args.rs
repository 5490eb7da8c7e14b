//! The command line: every subcommand and flag. The `///` comments are
//! the `--help` text.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use idgen::config::Overrides;

/// idgen: unique 64-bit IDs over gRPC that never repeat.
#[derive(Parser)]
#[command(version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the ID service.
    Serve(ServeArgs),
    /// Create an empty state file for a new node.
    ///
    /// Refuses to overwrite an existing one. Never the fix for a lost
    /// state file: it restarts segment, lease, strict and formatted
    /// counters (and forgets stored formats); restore a backup instead
    /// (`idgen state restore`).
    Init(ConfigArgs),
    /// Ask a running server for IDs.
    Gen(GenArgs),
    /// Split an ID into its parts, offline, under the configured layout.
    Decode(DecodeArgs),
    /// Load-test a running server over gRPC.
    Bench(BenchArgs),
    /// Administer a running server (idgen.v1.Admin): segment tags, formats,
    /// strict namespaces and keys, holders of worker ids, lease and format
    /// tokens (release, renew), the cluster layout, skip-ahead.
    Admin(AdminArgs),
    /// Validate a config (file, IDGEN_* environment, flags) and print the
    /// effective settings, secrets redacted, without starting anything.
    CheckConfig(ServeArgs),
    /// Back up and restore the embedded state file.
    #[command(subcommand)]
    State(StateCommand),
    /// Formatted IDs on a running node: split one into its fields, or show
    /// a counter's durable record (`idgen gen --format NAME` makes them).
    #[command(subcommand)]
    Format(FormatCommand),
    /// TLS helpers: a development PKI in one step.
    #[command(subcommand)]
    Tls(TlsCommand),
}

/// `idgen format`: the formatted-ID calls of idgen.v1.IdGen besides
/// GenFormatted.
#[derive(Subcommand)]
pub enum FormatCommand {
    /// Split formatted ID ID of format NAME into its fields (time fields,
    /// node or token, counter, parameters): ParseFormatted.
    Parse {
        /// The format's name.
        name: String,
        /// The ID, as `idgen gen --format NAME` printed it.
        id: String,
        #[command(flatten)]
        admin: RevealArgs,
        #[command(flatten)]
        node: FormatNodeArgs,
    },
    /// Show the durable record of a counter of format NAME: the period it
    /// is in (its start, printed as a time), the last value any node may
    /// have used in it, when the next period starts: GetFormatCounter.
    /// Per-node formats show the counter of the node that answers; with
    /// --discover consul every passing node answers under its address.
    /// A hidden format's counter (`{seq:N:hidden}`, `hide = true`) tells
    /// how many IDs it issued: it needs the admin token.
    Counter {
        /// The format's name.
        name: String,
        /// A scope parameter of the format, `name=value` (repeat for
        /// several): each scope value has its own counter.
        #[arg(long, value_parser = parse_param)]
        param: Vec<(String, String)>,
        #[command(flatten)]
        admin: RevealArgs,
        #[command(flatten)]
        node: FormatNodeArgs,
    },
}

/// The admin credential a call sends so that a hidden ID's internal value
/// is revealed (the node audit-logs it); without one the node gives the
/// public view of an ID, and refuses a hidden format's counter.
#[derive(Args)]
pub struct RevealArgs {
    /// The node's admin token, so a hidden counter's internal value is
    /// shown. Prefer --admin-token-file or IDGEN_ADMIN__TOKEN: a command
    /// line is visible to other users. Either flag wins over the variable.
    #[arg(
        long = "admin-token",
        value_name = "TOKEN",
        conflicts_with = "admin_token_file"
    )]
    pub admin_token: Option<String>,
    /// A file holding the admin token.
    #[arg(long = "admin-token-file", value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
}

/// Which node `idgen format` asks, and how it prints.
#[derive(Args)]
pub struct FormatNodeArgs {
    /// The node's gRPC address: host:port, http://host:port or
    /// https://host:port (with --ca).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: String,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Longest wait for the connection and the call.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Finding the nodes through Consul instead of --addr.
    #[command(flatten)]
    pub discovery: DiscoveryArgs,
}

#[derive(Subcommand)]
pub enum TlsCommand {
    /// Write a development CA, a node certificate and client certificates
    /// (X.509 v3, ECDSA P-256) to DIR, and print the config lines and
    /// client flags that use them.
    ///
    /// ca.pem/ca-key.pem sign the others; node.pem/node-key.pem (server
    /// authentication) name localhost, 127.0.0.1, ::1 and --hosts;
    /// client.pem/client-key.pem and NAME.pem/NAME-key.pem for each
    /// --clients NAME (client authentication) carry the name as subject
    /// CN, which admin.client_cert_names matches. Keys are written 0600.
    /// Refuses to overwrite any file unless --force. For development and
    /// tests: in production use your own CA (docs/SECURITY.md).
    DevCerts(DevCertsArgs),
}

#[derive(Args)]
pub struct DevCertsArgs {
    /// Directory to write to (created if missing, mode 0700).
    pub dir: PathBuf,
    /// More names for the node certificate, comma-separated: DNS names or
    /// IP addresses (e.g. idgen.internal,10.0.0.5).
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    pub hosts: Vec<String>,
    /// Days every certificate is valid from today.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub days: u32,
    /// More client certificates, one per NAME (letters, digits, `.`, `_`,
    /// `-`): NAME.pem and NAME-key.pem, subject CN NAME.
    #[arg(long, num_args = 1.., value_name = "NAME")]
    pub clients: Vec<String>,
    /// Overwrite files that exist.
    #[arg(long)]
    pub force: bool,
}

#[derive(Subcommand)]
pub enum StateCommand {
    /// Write a consistent snapshot of the state file to FILE.
    ///
    /// The snapshot holds every counter (segment, lease, strict, formatted)
    /// and the stored formats, when it was taken and how fast each counter
    /// moved. By default the running node takes it (admin rpc Backup; it
    /// keeps issuing meanwhile); --offline reads the state file of a
    /// stopped node directly.
    Backup(BackupArgs),
    /// Recreate a lost state file from a snapshot, skipping ahead.
    ///
    /// Every segment, lease and strict counter moves forward by
    /// --skip-ahead, and each format's counters by that format's own margin
    /// (--format-skip-ahead), so nothing handed out after the snapshot is
    /// handed out again. Refuses to overwrite an existing state file;
    /// without --skip-ahead prints the suggested margins and refuses.
    Restore(RestoreArgs),
}

#[derive(Args)]
pub struct BackupArgs {
    /// Where to write the snapshot (refuses to overwrite a file).
    pub file: PathBuf,
    /// The running node's gRPC address: host:port, http://host:port or
    /// https://host:port (with --ca).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: String,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Longest wait for the connection and for the node to take the
    /// snapshot.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// The node's admin token (its admin.token). Prefer --token-file or
    /// the environment (IDGEN_ADMIN__TOKEN); either flag wins over the
    /// variable.
    #[arg(
        long = "token",
        value_name = "TOKEN",
        conflicts_with = "admin_token_file"
    )]
    pub admin_token: Option<String>,
    /// A file holding the admin token.
    #[arg(long = "token-file", value_name = "TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Read the state file named by --config/--state directly; only while
    /// no node runs on it.
    #[arg(long)]
    pub offline: bool,
    #[command(flatten)]
    pub config: ConfigArgs,
}

#[derive(Args)]
pub struct RestoreArgs {
    /// The snapshot written by `idgen state backup`, or the node's mirror
    /// (`store.mirror_path`).
    pub backup: PathBuf,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Move every segment max_id and lease token counter forward by this
    /// many IDs. It must cover what the node handed out after the backup,
    /// which the backup cannot know: you state it (required, except for a
    /// mirror or rescue snapshot, which need none).
    #[arg(long)]
    pub skip_ahead: Option<u64>,
    /// Move every strict counter (and deleted key) forward by this many
    /// values: strict values count calls, not IDs, so they have their own
    /// margin. Required when the backup holds strict keys or strict mode
    /// is on (except for a mirror or rescue snapshot).
    #[arg(long)]
    pub strict_skip_ahead: Option<u64>,
    /// Formatted counters: move format NAME's counters by N (`NAME=N`), or
    /// every format's not named (`N`); repeatable. Required for every
    /// format the backup defines (except for a mirror or rescue snapshot).
    /// A bare N is also the margin of formats created after the restore
    /// that the backup does not define (default: the largest margin given,
    /// at least 10,000).
    #[arg(long = "format-skip-ahead", value_name = "[NAME=]N")]
    pub format_skip_ahead: Vec<String>,
}

#[derive(Args)]
pub struct ConfigArgs {
    /// TOML config file (see config/idgen.example.toml); the IDGEN_CONFIG
    /// environment variable names one too. Without either: defaults plus
    /// IDGEN_* environment variables.
    #[arg(long, short, env = "IDGEN_CONFIG")]
    pub config: Option<PathBuf>,
    /// Embedded state file; overrides store.path.
    #[arg(long)]
    pub state: Option<PathBuf>,
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// gRPC listen address; overrides server.grpc_listen.
    #[arg(long)]
    pub grpc_listen: Option<String>,
    /// HTTP listen address; overrides server.http_listen.
    #[arg(long)]
    pub http_listen: Option<String>,
    /// Datacenter id; overrides node.datacenter_id.
    #[arg(long)]
    pub datacenter_id: Option<u64>,
    /// Worker id; overrides node.worker_id.
    #[arg(long)]
    pub worker_id: Option<u64>,
    /// Testing only: run as if the wall clock were off by this many
    /// milliseconds (negative = behind), to test clock rules without
    /// touching the machine's clock.
    #[arg(long, hide = true, allow_hyphen_values = true, default_value_t = 0)]
    pub test_clock_offset_ms: i64,
}

#[derive(Args)]
pub struct GenArgs {
    /// The node's gRPC address: host:port, http://host:port or
    /// https://host:port (with --ca).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: String,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Longest wait for the connection and for each call. With
    /// --discover, each node gets a third of it before the call moves to
    /// another node.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// How many IDs. More than --batch are fetched in several calls, each
    /// printed as it returns; after a failed call or Ctrl-C (exit status
    /// 130) the IDs printed so far stay and stderr says how many.
    #[arg(long, short = 'n', default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub count: u32,
    /// Most IDs asked for in one call (the server's server.max_batch,
    /// 10,000 by default).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
    /// Mode: snowflake, segment, lease or strict (UUIDv7: --uuid or --ulid).
    #[arg(long, default_value = "snowflake")]
    pub mode: String,
    /// Tag (segment) or key (strict).
    #[arg(long, default_value = "")]
    pub tag: String,
    /// Formatted IDs of this format (a stored format: `idgen admin formats
    /// list`, or the server's `[[formats]]`) instead of --mode; with
    /// --discover, calls go to the passing nodes with failover.
    #[arg(long, conflicts_with = "tag")]
    pub format: Option<String>,
    /// A parameter of --format, `name=value` (repeat for several): the
    /// template's `{param:..}` fields, scope parameters, a Lua `salt`.
    #[arg(long, value_parser = parse_param, requires = "format")]
    pub param: Vec<(String, String)>,
    /// UUIDv7 instead of --mode (canonical 8-4-4-4-12 text): unique
    /// across the cluster, increasing per node.
    #[arg(long, conflicts_with_all = ["format", "tag"])]
    pub uuid: bool,
    /// UUIDv7 as ULID text (Crockford base32: the same 128 bits, sorting
    /// the same).
    #[arg(long, conflicts_with_all = ["format", "tag", "uuid"])]
    pub ulid: bool,
    /// Print JSON (`{"ids": ["..."]}`) instead of one ID per line.
    #[arg(long)]
    pub json: bool,
    /// Finding the nodes through Consul instead of --addr.
    #[command(flatten)]
    pub discovery: DiscoveryArgs,
}

#[derive(Args)]
pub struct DecodeArgs {
    /// The ID, in decimal; or a UUIDv7 (8-4-4-4-12, 32 hex digits or a
    /// ULID), whose time, datacenter, worker and counter are printed.
    pub id: String,
    /// Config file whose layout to decode with (defaults otherwise);
    /// IDGEN_CONFIG names one too.
    #[arg(long, short, env = "IDGEN_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// The mode the ID came from: snowflake, lease, or segment (with
    /// --tag and --addr: a hidden tag's IDs).
    #[arg(long, default_value = "snowflake")]
    pub mode: String,
    /// With --mode segment: the hidden segment tag the ID came from. Only
    /// a node with the tag's key can undo the hiding, so it needs --addr;
    /// the node shows the key version, and with the admin token the
    /// internal value.
    #[arg(long, requires = "addr")]
    pub tag: Option<String>,
    /// Ask the node at this gRPC address (DecodeId) instead of decoding
    /// offline: needed for a hidden layout (`layout.hide`), whose IDs only
    /// a node with the key can reveal. host:port, http:// or https://
    /// (with --ca).
    #[arg(long)]
    pub addr: Option<String>,
    /// With --addr: the node's admin token, so a hidden ID's internal
    /// parts are shown (the node audit-logs it); without it the node gives
    /// the public view. Prefer --admin-token-file or IDGEN_ADMIN__TOKEN;
    /// either flag wins over the variable.
    #[arg(
        long = "admin-token",
        value_name = "TOKEN",
        conflicts_with = "admin_token_file",
        requires = "addr"
    )]
    pub admin_token: Option<String>,
    /// A file holding the admin token (with --addr).
    #[arg(long = "admin-token-file", value_name = "FILE", requires = "addr")]
    pub admin_token_file: Option<PathBuf>,
    /// TLS to the node (https:// --addr; --cert/--key: a client
    /// certificate, which admin.client_cert_names may name as an admin).
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Longest wait for the connection and the call (with --addr).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Server URL: http://host:port, or https://host:port with --ca.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// HTTP/2 connections. A node takes at most
    /// server.max_connections_per_peer (64 by default) from one address;
    /// past it, new connections are closed.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Calls in flight at once (spread over the connections).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Measured duration, e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Warm-up before measuring.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// 1 = unary GenId; N > 1 = GenIds with count N.
    #[arg(long, default_value_t = 1)]
    pub batch: u32,
    /// Mode to ask for: snowflake, segment, lease or strict.
    #[arg(long, default_value = "snowflake")]
    pub mode: String,
    /// Tag (segment mode) or `namespace/key` (strict mode).
    #[arg(long, default_value = "")]
    pub tag: String,
    /// With --discover: spread the calls over this many tags or keys,
    /// `<tag>-0` to `<tag>-<N-1>`, each caller moving on to the next one
    /// after every call (e.g. strict on 100 keys from a whole cluster).
    /// 1: every call on --tag itself.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000), requires = "discover")]
    pub keys: u32,
    /// Call GenFormatted of this format instead (--batch is its count).
    #[arg(long)]
    pub format: Option<String>,
    /// UUIDv7 instead of --mode: GenUuid, or GenUuids with --batch (16
    /// bytes a UUID on the wire); checked in 128-bit order like any run.
    #[arg(long, conflicts_with_all = ["format", "tag"])]
    pub uuid: bool,
    /// Of the --concurrency callers, this many ask for --small-batch
    /// instead of --batch (a mixed load, e.g. 63 x 1000 and 1 x 10); each
    /// size's latency is reported on its own.
    #[arg(long, default_value_t = 0)]
    pub small_callers: usize,
    /// The batch of the --small-callers (1 = unary GenId).
    #[arg(long, default_value_t = 10)]
    pub small_batch: u32,
    /// A parameter of --format, `name=value` (repeat for several).
    #[arg(long, value_parser = parse_param, requires = "format")]
    pub param: Vec<(String, String)>,
    /// Also run the same load against a bare tonic server that returns a
    /// counter (started in this process), and print the ratio.
    #[arg(long)]
    pub baseline: bool,
    /// With --baseline: alternate bare and idgen runs this many times and
    /// compare medians (the machine's noise hits both alike).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// The IDs are hidden (a hidden snowflake layout or segment tag), so
    /// their order is hidden too: IDs that do not rise within a caller are
    /// counted but do not fail the run.
    #[arg(long)]
    pub unordered: bool,
    /// Finding the nodes through Consul instead of --addr.
    #[command(flatten)]
    pub discovery: DiscoveryArgs,
    /// TLS to the node (https:// --addr, or the nodes found with
    /// --discover).
    #[command(flatten)]
    pub tls: TlsArgs,
}

#[derive(Args)]
pub struct AdminArgs {
    /// The node's gRPC address: host:port, http://host:port or
    /// https://host:port (with --ca).
    #[arg(long, global = true, default_value = "127.0.0.1:50051")]
    pub addr: String,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Longest wait for the connection and for each call (at least 75 s
    /// for a forced release, which waits out a lock-delay of up to 60 s,
    /// and for skip-ahead).
    #[arg(long, global = true, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// The server's admin token (its admin.token). Prefer --token-file or
    /// the environment (IDGEN_ADMIN__TOKEN, the same variable the server
    /// reads; the older IDGEN_ADMIN_TOKEN still works, with a warning): a
    /// command line is visible to other users. Either flag wins over the
    /// variables.
    #[arg(
        long = "token",
        value_name = "TOKEN",
        global = true,
        conflicts_with = "admin_token_file"
    )]
    pub admin_token: Option<String>,
    /// A file holding the admin token.
    #[arg(long = "token-file", value_name = "TOKEN_FILE", global = true)]
    pub admin_token_file: Option<PathBuf>,
    /// Print JSON (IDs as decimal strings).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Segment tags: create, update, get, list, delete.
    #[command(subcommand)]
    Tags(TagsCommand),
    /// Who holds each worker id, lease token and format token (instance,
    /// address, since, session).
    Holders,
    /// Free a worker id or lease token held in Consul. Refused while the
    /// holder is alive unless --force, which destroys the holder's session
    /// (freeing everything that node holds) and waits out its lock-delay.
    Release(ReleaseArgs),
    /// Renew a holder's Consul session once by hand (the session id as
    /// `admin holders` shows it). Keeps its ids held longer; it never
    /// extends the holder's own deadline.
    Renew {
        /// The session id.
        session: String,
    },
    /// Strict namespaces and keys: steps, live keys, delete.
    #[command(subcommand)]
    Strict(StrictCommand),
    /// The cluster's ID layout recorded in Consul: show it, or change it
    /// (accepted only when no ID can repeat).
    #[command(subcommand)]
    Layout(LayoutCommand),
    /// Formatted-mode formats: create, update, get, list, delete, reload.
    #[command(subcommand)]
    Formats(FormatsCommand),
    /// Hide keys of hidden namespaces: create, rotate, retire, list
    /// (versions and states; never key material).
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Datacenter ids claimed across Consul datacenters: list, release.
    #[command(subcommand)]
    Datacenters(DatacentersCommand),
    /// After a Consul snapshot restore: move every counter of the cluster
    /// (segment, strict, lease token, formatted) forward by --margin and
    /// every high-water mark to now + hwm.reserve. Running it twice moves
    /// twice (safe). Nodes that refused a rolled-back counter resume by
    /// themselves.
    SkipAhead {
        /// How far: above the number of IDs any one counter handed out
        /// between the snapshot and the restore (docs/BACKUP.md shows
        /// how to read it off the metrics).
        #[arg(long)]
        margin: u64,
        /// Run it from here, straight against Consul, with this node
        /// config's [consul] section (address, token, TLS) and hwm.reserve,
        /// instead of through a node's admin API (--addr): for a cluster
        /// whose nodes are all stopped.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// `idgen admin datacenters ...`.
#[derive(Subcommand)]
pub enum DatacentersCommand {
    /// Every datacenter id claim in the primary Consul datacenter: owner,
    /// state (owned, releasing, released) and floor.
    List,
    /// Release a datacenter id so that another Consul datacenter can claim
    /// it (rule 44). Refused while the owner datacenter has a passing node
    /// or a held worker lock of the id; the next owner starts above the
    /// old owner's highest mark.
    Release {
        /// The datacenter id (`node.datacenter_id`).
        id: u64,
        /// Destroy the owner's sessions of the id and wait out their
        /// lock-delay (up to 60 s) instead of refusing: the owner's nodes
        /// stop issuing.
        #[arg(long)]
        force: bool,
    },
}

/// `idgen admin keys ...`.
#[derive(Subcommand)]
pub enum KeysCommand {
    /// Create a hide key id with version 0 active (a new random key,
    /// sealed with the nodes' master key).
    Create {
        /// The key id: 1 to 63 of a-z, 0-9, '_', '-'.
        key_id: String,
    },
    /// Add the next version as active; the previous one becomes
    /// decode-only (IDs made with it still decode). Refused when the new
    /// version is above what a namespace using the key can hold (a
    /// format's hidden counter holds versions 0 to 9), naming it.
    Rotate {
        /// The key id.
        key_id: String,
        /// Rotate even past what a namespace using the key can hold: that
        /// namespace then refuses to issue for good (its IDs still decode).
        #[arg(long)]
        force: bool,
    },
    /// Make the active version decode-only without a successor: hidden
    /// namespaces using the key refuse to issue until it is rotated.
    Retire {
        /// The key id.
        key_id: String,
    },
    /// Every key id, its versions and their states.
    List,
}

#[derive(Subcommand)]
pub enum FormatsCommand {
    /// Create a format (stored durably; served by this node at once and by
    /// every Consul node within a few seconds).
    Create {
        /// The definition.
        #[command(flatten)]
        def: FormatDefArgs,
        /// Assert that no format by this name ever issued an ID on this
        /// cluster: on a state file restored from a backup, the format then
        /// starts at its minimum instead of the restore's margin for new
        /// formats. Your assertion: if the lost node did create and use the
        /// name after the backup, IDs repeat.
        #[arg(long)]
        fresh: bool,
    },
    /// Replace a format's definition: only description, min, max, step and
    /// a Lua rule's code may change (nothing that could repeat an ID).
    Update(FormatDefArgs),
    /// Show one stored format.
    Get {
        /// Format name.
        name: String,
    },
    /// List every stored format (deleted ones marked).
    List,
    /// Delete a format: a tombstone keeps the name for good (it can never
    /// be created again), so no new definition can repeat its IDs.
    Delete {
        /// Format name.
        name: String,
    },
    /// Reload the node's formats from the stored definitions (atomic: the
    /// old ones serve until every format compiled).
    Reload,
}

/// A format definition: a file (TOML or JSON, the keys of a `[[formats]]`
/// entry), flags, or both (flags win).
#[derive(Args)]
pub struct FormatDefArgs {
    /// Format name (overrides the file's `name`).
    pub name: Option<String>,
    /// A TOML or JSON file holding the definition (`.json`: JSON; otherwise
    /// TOML, either the keys alone or one `[[formats]]` entry).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Template, e.g. "{yyyy}{MM}{dd}{node:2}{seq:6}".
    #[arg(long)]
    pub template: Option<String>,
    /// A file holding a Lua rule's code.
    #[arg(long)]
    pub lua_file: Option<PathBuf>,
    /// Preset: uniq64 or idc.
    #[arg(long)]
    pub preset: Option<String>,
    /// IANA time zone, e.g. Asia/Shanghai (`--zone` is the older name).
    #[arg(long = "time-zone", alias = "zone")]
    pub time_zone: Option<String>,
    /// Reset period: never, hour, day, month, year, or seconds (e.g. 600s).
    #[arg(long)]
    pub reset: Option<String>,
    /// The counter's first value in a period.
    #[arg(long)]
    pub min: Option<u64>,
    /// The counter's last value in a period.
    #[arg(long)]
    pub max: Option<u64>,
    /// How much the counter grows per ID.
    #[arg(long)]
    pub step: Option<u64>,
    /// A scope parameter (a counter per value); repeat for several.
    #[arg(long = "scope-param")]
    pub scope_params: Vec<String>,
    /// Lua rules: the exact length of every ID.
    #[arg(long)]
    pub length: Option<usize>,
    /// Free text for operators.
    #[arg(long)]
    pub description: Option<String>,
    /// Hide every {seq:N} of the template (N >= 7) as {seq:N:hidden}:
    /// shown through the hide key (`idgen admin keys create`). Frozen.
    #[arg(long)]
    pub hide: bool,
    /// The hide key a hidden counter is shown through (default: the
    /// format's name). Frozen.
    #[arg(long)]
    pub hide_key: Option<String>,
}

#[derive(Subcommand)]
pub enum LayoutCommand {
    /// Show the recorded layout, its generation and earlier layouts.
    Get,
    /// Change the cluster's layout: a maintenance procedure, not a routine
    /// command (docs/OPERATIONS.md#changing-the-cluster-layout).
    /// Accepted only when the new layout's first ID is above every ID
    /// issued so far (every stored high-water mark is checked); every node
    /// still on the old layout is then fenced until it is restarted with
    /// the new [layout]. Refused without --yes.
    Set {
        /// Preset: twitter, sonyflake or js53.
        #[arg(long)]
        preset: String,
        /// Epoch, RFC 3339 UTC (e.g. 2023-01-01T00:00:00Z).
        #[arg(long)]
        epoch: String,
        /// Time unit override, whole milliseconds (e.g. 10ms).
        #[arg(long, value_parser = humantime::parse_duration)]
        time_unit: Option<std::time::Duration>,
        /// Time field width override.
        #[arg(long)]
        time_bits: Option<u32>,
        /// Datacenter field width override.
        #[arg(long)]
        datacenter_bits: Option<u32>,
        /// Worker field width override.
        #[arg(long)]
        worker_bits: Option<u32>,
        /// Sequence field width override.
        #[arg(long)]
        sequence_bits: Option<u32>,
        /// Change only if the record is still at this generation (from
        /// `layout get`).
        #[arg(long)]
        expect_generation: Option<u64>,
        /// Confirms that every running node on the old layout stops
        /// issuing until restarted with the new one (without it the
        /// command prints the procedure and changes nothing).
        #[arg(long, visible_alias = "i-understand-this-fences")]
        yes: bool,
    },
}

#[derive(Subcommand)]
pub enum TagsCommand {
    /// Create a tag; its first ID is --initial + 1.
    Create {
        /// Tag name: 1 to 64 of a-z 0-9 _ -.
        tag: String,
        /// The first ID will be this + 1.
        #[arg(long, default_value_t = 0)]
        initial: u64,
        /// IDs per range (1 to 1000000000).
        #[arg(long, default_value_t = 1000)]
        step: u64,
        /// Free text for operators.
        #[arg(long, default_value = "")]
        description: String,
        /// Hide the tag's volume through this hide key (`admin keys
        /// create`); fixed for the tag's name for good.
        #[arg(long)]
        hide_key: Option<String>,
        /// Bits of key version at the top of each hidden ID (1 to 8).
        #[arg(long, default_value_t = 4, requires = "hide_key")]
        hide_version_bits: u32,
        /// Bits permuted under them (20 to 63 - version bits): the tag
        /// can issue 2^N IDs.
        #[arg(long, default_value_t = 40, requires = "hide_key")]
        hide_domain_bits: u32,
    },
    /// Change a tag's step or description, or move its max_id forward.
    Update {
        /// Tag name.
        tag: String,
        /// New step (1 to 1000000000).
        #[arg(long)]
        step: Option<u64>,
        /// New description.
        #[arg(long)]
        description: Option<String>,
        /// New max_id: only forward (IDs up to it are skipped).
        #[arg(long)]
        max_id: Option<u64>,
    },
    /// Show one tag.
    Get {
        /// Tag name.
        tag: String,
    },
    /// List every tag.
    List,
    /// Delete a tag (a tombstone keeps its max_id: IDs never repeat).
    Delete {
        /// Tag name.
        tag: String,
    },
}

#[derive(Args)]
pub struct ReleaseArgs {
    /// What to free: worker, lease-token (a lease-mode holder; `token`,
    /// its older name, is accepted too) or format-token.
    #[arg(long)]
    pub kind: String,
    /// The worker id or token number (for a format token, the `id`
    /// `idgen admin holders` shows, not the rendered characters).
    #[arg(long)]
    pub id: u64,
    /// The datacenter of a worker id.
    #[arg(long, conflicts_with = "zone")]
    pub datacenter: Option<u64>,
    /// The zone of a lease token.
    #[arg(long)]
    pub zone: Option<u64>,
    /// The space of a format token: digits-2, alnum-3, uniq64...
    #[arg(long)]
    pub space: Option<String>,
    /// Release even though the holder is alive.
    #[arg(long)]
    pub force: bool,
}

#[derive(Subcommand)]
pub enum StrictCommand {
    /// Set a namespace's step.
    SetStep {
        /// Namespace: 1 to 64 of a-z 0-9 _ -.
        namespace: String,
        /// Step (1 to 1000000).
        step: u64,
    },
    /// Show a namespace's step.
    GetStep {
        /// Namespace.
        namespace: String,
    },
    /// List namespaces with a stored step.
    List,
    /// List the live keys of a namespace and their last values.
    Keys {
        /// Namespace.
        namespace: String,
    },
    /// Delete a key (`namespace/key`); a tombstone keeps its last value,
    /// so the key used again continues above it.
    Delete {
        /// The key, `namespace/key`.
        key: String,
    },
}

impl ConfigArgs {
    /// The flags as config overrides (only `--state`).
    pub fn overrides(&self) -> Overrides {
        Overrides {
            state_path: self.state.clone(),
            ..Overrides::default()
        }
    }
}

impl ServeArgs {
    /// The flags that override config keys.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            grpc_listen: self.grpc_listen.clone(),
            http_listen: self.http_listen.clone(),
            state_path: self.config.state.clone(),
            datacenter_id: self.datacenter_id,
            worker_id: self.worker_id,
        }
    }
}

/// `--discover consul` and where to ask, for the commands that call nodes.
#[derive(Args)]
pub struct DiscoveryArgs {
    /// Find the nodes through Consul instead of --addr (`consul`): the
    /// passing instances of --service, through the agent at --consul, with
    /// failover between them. Consul's own variables apply as in the
    /// consul CLI (flags win): CONSUL_HTTP_ADDR, CONSUL_HTTP_SSL,
    /// CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE, CONSUL_CACERT,
    /// CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY, CONSUL_TLS_SERVER_NAME,
    /// CONSUL_HTTP_SSL_VERIFY.
    #[arg(long, value_parser = ["consul"])]
    pub discover: Option<String>,
    /// The Consul agent's HTTP address, for --discover consul: host:port,
    /// http://host:port or https://host:port [default: CONSUL_HTTP_ADDR,
    /// else http://127.0.0.1:8500].
    #[arg(long)]
    pub consul: Option<String>,
    /// The Consul service name, for --discover consul.
    #[arg(long, default_value = "idgen")]
    pub service: String,
    /// CA certificate(s), PEM, that signed the Consul agent's HTTPS
    /// certificate; needed by an https:// --consul address [default:
    /// CONSUL_CACERT].
    #[arg(long, value_name = "FILE")]
    pub consul_ca: Option<std::path::PathBuf>,
    /// Client certificate, PEM, for a Consul agent with verify_incoming
    /// [default: CONSUL_CLIENT_CERT].
    #[arg(long, value_name = "FILE", requires = "consul_key")]
    pub consul_cert: Option<std::path::PathBuf>,
    /// Private key of --consul-cert, PEM [default: CONSUL_CLIENT_KEY].
    #[arg(long, value_name = "FILE", requires = "consul_cert")]
    pub consul_key: Option<std::path::PathBuf>,
    /// Name the Consul agent's certificate must carry when it is not the
    /// --consul address's host [default: CONSUL_TLS_SERVER_NAME].
    #[arg(long, value_name = "NAME")]
    pub consul_tls_server_name: Option<String>,
    /// Another Consul datacenter whose nodes are used while the local one
    /// lists no passing node, for --discover consul (repeat it for more,
    /// tried in order). Snowflake IDs and UUIDs carry the datacenter id
    /// and cross; strict, segment, lease and formatted calls are refused
    /// there, as their counters are per datacenter (docs/CLIENTS.md,
    /// "Falling back to another datacenter").
    #[arg(long = "fallback-datacenter", value_name = "DC", requires = "discover")]
    pub fallback_datacenters: Vec<String>,
}

/// `name=value` of `--param`.
fn parse_param(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{s:?} is not name=value"))
}

/// The TLS options of every command that dials a node (what they do
/// with them is `tls.rs`'s).
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// CA certificate(s), PEM, that signed the node's certificate; needed
    /// for https:// addresses.
    #[arg(long = "ca", id = "tls_ca", value_name = "FILE", global = true)]
    pub ca: Option<PathBuf>,
    /// Client certificate chain, PEM, for nodes that ask for one (mTLS).
    #[arg(
        long = "cert",
        id = "tls_cert",
        value_name = "FILE",
        global = true,
        requires = "tls_key"
    )]
    pub cert: Option<PathBuf>,
    /// Private key of --cert, PEM.
    #[arg(
        long = "key",
        id = "tls_key",
        value_name = "FILE",
        global = true,
        requires = "tls_cert"
    )]
    pub key: Option<PathBuf>,
    /// Check the node's certificate against this name instead of the
    /// address's host: needed with `--discover` (Consul gives IP addresses)
    /// when the certificates name a DNS name such as `idgen.internal`.
    #[arg(
        long = "tls-server-name",
        id = "tls_server_name",
        value_name = "NAME",
        global = true,
        requires = "tls_ca"
    )]
    pub server_name: Option<String>,
}
