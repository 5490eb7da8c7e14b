//! The `idgen` command: serve, init, gen, decode, bench, admin.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use tokio::net::TcpListener;

use idgen::bench::{self, BaselineServer, BenchOptions};
use idgen::config::{Config, FileConfig, Overrides};
use idgen::id::{Clock, Mode, OffsetClock, SystemClock};
use idgen::proto::{self, id_gen_client::IdGenClient};
use idgen::server::{decode_snowflake, Node};
use idgen::store::EmbeddedStore;

mod cli;

use cli::output::outln;

/// idgen: unique 64-bit IDs over gRPC that never repeat.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the ID service.
    Serve(ServeArgs),
    /// Create an empty state file for a new node.
    ///
    /// Refuses to overwrite an existing one. Never the fix for a lost
    /// state file: it restarts segment, lease and strict counters; restore
    /// a backup instead (`idgen state restore`).
    Init(ConfigArgs),
    /// Ask a running server for IDs.
    Gen(GenArgs),
    /// Split an ID into its parts, offline, under the configured layout.
    Decode(DecodeArgs),
    /// Load-test a running server over gRPC.
    Bench(BenchArgs),
    /// Administer a running server (idgen.v1.Admin): segment tags, worker
    /// id and lease token holders, strict namespaces' steps.
    Admin(AdminArgs),
    /// Validate a config (file, IDGEN_* environment, flags) and print the
    /// effective settings, secrets redacted, without starting anything.
    CheckConfig(ServeArgs),
    /// Back up and restore the embedded state file.
    #[command(subcommand)]
    State(StateCommand),
}

#[derive(Subcommand)]
enum StateCommand {
    /// Write a consistent snapshot of the state file to FILE.
    ///
    /// The snapshot records when it was taken and how fast each counter
    /// moved. By default the running node takes it (admin rpc Backup; it
    /// keeps issuing meanwhile); --offline reads the state file of a
    /// stopped node directly.
    Backup(BackupArgs),
    /// Recreate a lost state file from a snapshot, skipping ahead.
    ///
    /// Every segment, lease and strict counter moves forward by
    /// --skip-ahead, so nothing handed out after the snapshot is handed
    /// out again. Refuses to overwrite an existing state file; without
    /// --skip-ahead prints a suggested margin and refuses.
    Restore(RestoreArgs),
}

#[derive(Args)]
struct BackupArgs {
    /// Where to write the snapshot (refuses to overwrite a file).
    file: PathBuf,
    /// The running node's gRPC address: host:port or http://host:port.
    #[arg(long, default_value = "127.0.0.1:50051")]
    addr: String,
    /// Longest wait for the connection and for the node to take the
    /// snapshot.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The node's admin token (its admin.token). Prefer --token-file or
    /// the environment (IDGEN_ADMIN__TOKEN).
    #[arg(
        long,
        env = "IDGEN_ADMIN__TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    token: Option<String>,
    /// A file holding the admin token.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Read the state file named by --config/--state directly; only while
    /// no node runs on it.
    #[arg(long)]
    offline: bool,
    #[command(flatten)]
    config: ConfigArgs,
}

#[derive(Args)]
struct RestoreArgs {
    /// The snapshot written by `idgen state backup`.
    backup: PathBuf,
    #[command(flatten)]
    config: ConfigArgs,
    /// Move every segment max_id, lease token counter and strict counter
    /// forward by this many IDs/values. Must exceed what the node handed
    /// out after the snapshot; run without it for a suggestion.
    #[arg(long)]
    skip_ahead: Option<u64>,
}

#[derive(Args)]
struct ConfigArgs {
    /// TOML config file (see config/idgen.example.toml). Without it:
    /// defaults plus IDGEN_* environment variables.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Embedded state file; overrides store.path.
    #[arg(long)]
    state: Option<PathBuf>,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// gRPC listen address; overrides server.grpc_listen.
    #[arg(long)]
    grpc_listen: Option<String>,
    /// HTTP listen address; overrides server.http_listen.
    #[arg(long)]
    http_listen: Option<String>,
    /// Datacenter id; overrides node.datacenter_id.
    #[arg(long)]
    datacenter_id: Option<u64>,
    /// Worker id; overrides node.worker_id.
    #[arg(long)]
    worker_id: Option<u64>,
    /// Testing only: run as if the wall clock were off by this many
    /// milliseconds (negative = behind), to test clock rules without
    /// touching the machine's clock.
    #[arg(long, hide = true, allow_hyphen_values = true, default_value_t = 0)]
    test_clock_offset_ms: i64,
}

#[derive(Args)]
struct GenArgs {
    /// The node's gRPC address: host:port or http://host:port.
    #[arg(long, default_value = "127.0.0.1:50051")]
    addr: String,
    /// Longest wait for the connection and for each call.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// How many IDs. More than --batch are fetched in several calls.
    #[arg(long, short = 'n', default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    count: u32,
    /// Most IDs asked for in one call (the server's server.max_batch,
    /// 10,000 by default).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Mode: snowflake, segment, lease or strict.
    #[arg(long, default_value = "snowflake")]
    mode: String,
    /// Tag (segment) or key (strict).
    #[arg(long, default_value = "")]
    tag: String,
    /// Print JSON (`{"ids": ["..."]}`) instead of one ID per line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct DecodeArgs {
    /// The ID, in decimal.
    id: String,
    /// Config file whose layout to decode with (defaults otherwise).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// The mode the ID came from: snowflake or lease.
    #[arg(long, default_value = "snowflake")]
    mode: String,
}

#[derive(Args)]
struct BenchArgs {
    /// Server URL.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Calls in flight at once (spread over the connections).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Measured duration, e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Warm-up before measuring.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// 1 = unary GenId; N > 1 = GenIds with count N.
    #[arg(long, default_value_t = 1)]
    batch: u32,
    /// Mode to ask for: snowflake, segment, lease or strict.
    #[arg(long, default_value = "snowflake")]
    mode: String,
    /// Tag (segment mode) or `namespace/key` (strict mode).
    #[arg(long, default_value = "")]
    tag: String,
    /// Also run the same load against a bare tonic server that returns a
    /// counter (started in this process), and print the ratio.
    #[arg(long)]
    baseline: bool,
    /// With --baseline: alternate bare and idgen runs this many times and
    /// compare medians (the machine's noise hits both alike).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct AdminArgs {
    /// The node's gRPC address: host:port or http://host:port.
    #[arg(long, global = true, default_value = "127.0.0.1:50051")]
    addr: String,
    /// Longest wait for the connection and for each call.
    #[arg(long, global = true, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The server's admin token (its admin.token). Prefer --token-file or
    /// the environment (IDGEN_ADMIN__TOKEN, the same variable the server
    /// reads; the older IDGEN_ADMIN_TOKEN still works, with a warning): a
    /// command line is visible to other users.
    #[arg(
        long,
        global = true,
        env = "IDGEN_ADMIN__TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    token: Option<String>,
    /// A file holding the admin token.
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
    /// Print JSON (IDs as decimal strings).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Segment tags: create, update, get, list, delete.
    #[command(subcommand)]
    Tags(TagsCommand),
    /// Who holds each worker id and lease token.
    Holders,
    /// Free a worker id or lease token held in Consul. Refused while the
    /// holder is alive unless --force, which destroys the holder's session
    /// (freeing everything that node holds) and waits out its lock-delay.
    Release(ReleaseArgs),
    /// Strict namespaces' steps.
    #[command(subcommand)]
    Strict(StrictCommand),
    /// The cluster's ID layout recorded in Consul: show it, or change it
    /// (accepted only when no ID can repeat).
    #[command(subcommand)]
    Layout(LayoutCommand),
}

#[derive(Subcommand)]
enum LayoutCommand {
    /// Show the recorded layout, its generation and earlier layouts.
    Get,
    /// Change the cluster's layout. Accepted only when the new layout's
    /// first ID is above every ID issued so far (every stored high-water
    /// mark is checked); nodes on the old layout then fence themselves and
    /// must be restarted with the new [layout].
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
    },
}

#[derive(Subcommand)]
enum TagsCommand {
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
struct ReleaseArgs {
    /// What to free: worker or token.
    #[arg(long)]
    kind: String,
    /// The worker id or token number.
    #[arg(long)]
    id: u64,
    /// The datacenter of a worker id.
    #[arg(long, conflicts_with = "zone")]
    datacenter: Option<u64>,
    /// The zone of a lease token.
    #[arg(long)]
    zone: Option<u64>,
    /// Release even though the holder is alive.
    #[arg(long)]
    force: bool,
}

#[derive(Subcommand)]
enum StrictCommand {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`idgen decode ID | head -1`): done.
        Err(e) if cli::output::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(a) => serve(a).await,
        Command::Init(a) => init(a),
        Command::Gen(a) => gen(a).await,
        Command::Decode(a) => decode(a),
        Command::Bench(a) => bench_cmd(a).await,
        Command::Admin(a) => admin::run(a).await,
        Command::CheckConfig(a) => check_config(a),
        Command::State(StateCommand::Backup(a)) => state_backup(a).await,
        Command::State(StateCommand::Restore(a)) => state_restore(a),
    }
}

/// `RUST_LOG`, when set, wins over `log.level`; it is held to the same
/// rule, so a typo there cannot silence the node either.
fn log_filter(config: &Config) -> anyhow::Result<String> {
    match std::env::var("RUST_LOG") {
        Ok(filter) => {
            idgen::config::check_log_filter(&filter)
                .map_err(|problem| anyhow::anyhow!("environment variable RUST_LOG: {problem}"))?;
            Ok(filter)
        }
        Err(std::env::VarError::NotPresent) => Ok(config.log_level.clone()),
        Err(std::env::VarError::NotUnicode(_)) => {
            bail!("environment variable RUST_LOG is not valid UTF-8")
        }
    }
}

fn init_logging(config: &Config) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(log_filter(config)?)?;
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(!config.log_json && config.log_color.enabled(std::io::stderr().is_terminal()))
        .with_writer(std::io::stderr);
    if config.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
    Ok(())
}

async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let overrides = serve_overrides(&a);
    let clock: Arc<dyn Clock> = match a.test_clock_offset_ms {
        0 => Arc::new(SystemClock),
        ms => Arc::new(OffsetClock::new(SystemClock, ms.saturating_mul(1000))),
    };
    let mut config = Config::load(a.config.config.as_deref(), &overrides, clock.now_millis())?;
    init_logging(&config)?;
    // Before anything slow: a signal during start-up then means "stop once
    // started", never an abrupt default-action exit.
    let mut stop = Box::pin(idgen::shutdown::signal().context("cannot install signal handlers")?);
    if a.test_clock_offset_ms != 0 {
        tracing::warn!(
            offset_ms = a.test_clock_offset_ms,
            "testing only: the clock is shifted from the system clock"
        );
    }
    // Bound first, so the advertised address is the real one (port 0 picks
    // a free port); nothing is accepted until the node is ready.
    let grpc = TcpListener::bind(config.grpc_listen)
        .await
        .with_context(|| format!("cannot listen on server.grpc_listen {}", config.grpc_listen))?;
    let http = TcpListener::bind(config.http_listen)
        .await
        .with_context(|| format!("cannot listen on server.http_listen {}", config.http_listen))?;
    if config.advertise.is_none() {
        config.advertise = Some(grpc.local_addr()?);
    }
    // The bound port (port 0 picks one): advertised as Meta.metrics_port.
    config.http_listen = http.local_addr()?;
    let node = tokio::select! {
        node = Node::start(config.clone(), clock) => node.context("cannot start")?,
        () = &mut stop => {
            // Nothing was issued; a claimed worker id frees itself when its
            // session expires.
            tracing::warn!("stopped by a signal while starting");
            bail!("stopped by a signal while starting");
        }
    };
    tracing::info!(
        // Rounded to 0.1 ms: a log field, not a measurement.
        startup_ms = (started.elapsed().as_secs_f64() * 10_000.0).round() / 10.0,
        grpc = %grpc.local_addr()?,
        http = %http.local_addr()?,
        "ready"
    );
    let report = node.serve(grpc, http, stop).await?;
    if !report.drained {
        tracing::warn!("some calls were cut off at shutdown");
    }
    Ok(())
}

fn serve_overrides(a: &ServeArgs) -> Overrides {
    Overrides {
        grpc_listen: a.grpc_listen.clone(),
        http_listen: a.http_listen.clone(),
        state_path: a.config.state.clone(),
        datacenter_id: a.datacenter_id,
        worker_id: a.worker_id,
    }
}

fn check_config(a: ServeArgs) -> anyhow::Result<()> {
    let mut file = FileConfig::load(a.config.config.as_deref())?;
    file.apply(&serve_overrides(&a));
    let config = file.validate(SystemClock.now_millis())?;
    log_filter(&config)?;
    cli::output::write(&file.redacted_toml()?)?;
    let backend = match &config.backend {
        idgen::config::Backend::Embedded => {
            format!("embedded, state file {}", config.state_path.display())
        }
        idgen::config::Backend::Consul(c) => format!("consul at {}", c.client.address),
    };
    eprintln!(
        "config is valid: layout [{}], datacenter {}, worker {}, {backend}",
        config.layout, config.datacenter_id, config.worker_id
    );
    Ok(())
}
/// Printed by every `idgen init`: an empty state file is right for a new
/// node only.
const INIT_WARNING: &str = "warning: `idgen init` creates an EMPTY state file: segment, lease and strict counters start again from their initial values. Use it only for a node that has never issued IDs. If this node's state file was lost, do not init: restore the latest backup with `idgen state restore <backup-file> --config <file> --skip-ahead <margin>` (see README, Backup and recovery), or the node hands out IDs it handed out before.";

fn init(a: ConfigArgs) -> anyhow::Result<()> {
    let overrides = Overrides {
        state_path: a.state,
        ..Overrides::default()
    };
    let config = Config::load(a.config.as_deref(), &overrides, SystemClock.now_millis())?;
    if !matches!(config.backend, idgen::config::Backend::Embedded) {
        bail!("idgen init creates the embedded state file; with store.backend = \"consul\" there is nothing to create (nodes claim worker ids at start)");
    }
    eprintln!("{INIT_WARNING}");
    EmbeddedStore::create(&config.state_path, &config.layout.to_string())?;
    outln!(
        "created state file {} for layout [{}]",
        config.state_path.display(),
        config.layout
    )?;
    Ok(())
}

/// Loads the config of `idgen state ...` and checks it is embedded.
fn embedded_config(a: &ConfigArgs, what: &str) -> anyhow::Result<Config> {
    let overrides = Overrides {
        state_path: a.state.clone(),
        ..Overrides::default()
    };
    let config = Config::load(a.config.as_deref(), &overrides, SystemClock.now_millis())?;
    if !matches!(config.backend, idgen::config::Backend::Embedded) {
        bail!("idgen state {what} is for the embedded state file; with store.backend = \"consul\" the state lives in Consul: back up Consul (`consul snapshot save`)");
    }
    Ok(config)
}

async fn state_backup(a: BackupArgs) -> anyhow::Result<()> {
    use idgen::store::snapshot;
    if a.file.exists() {
        bail!(
            "{} exists already; refusing to overwrite it (give a new file name)",
            a.file.display()
        );
    }
    let bytes = if a.offline {
        let config = embedded_config(&a.config, "backup --offline")?;
        let path = config.state_path.clone();
        tokio::task::spawn_blocking(move || snapshot::take_offline(&path, SystemClock.now_millis()))
            .await??
    } else {
        if a.config.config.is_some() || a.config.state.is_some() {
            bail!("--config/--state are for --offline; a running node is reached with --addr");
        }
        let token = admin::token_from(a.token.as_deref(), a.token_file.as_deref())?;
        let mut client = admin::connect_to(&a.addr, token, a.timeout).await?;
        let mut stream = client
            .backup(proto::BackupRequest {})
            .await
            .map_err(cli::client::status_error)?
            .into_inner();
        let mut bytes = Vec::new();
        let mut total = None;
        while let Some(chunk) = stream.message().await.map_err(cli::client::status_error)? {
            total = Some(chunk.total_bytes);
            bytes.extend_from_slice(&chunk.data);
        }
        if total != Some(bytes.len() as u64) {
            bail!(
                "the snapshot stream ended early ({} of {:?} bytes); nothing was written, try again",
                bytes.len(),
                total
            );
        }
        bytes
    };
    let file = a.file.clone();
    let size = bytes.len();
    tokio::task::spawn_blocking(move || snapshot::write_snapshot_file(&file, &bytes)).await??;
    let info = snapshot::inspect(&a.file)?;
    let taken = std::time::UNIX_EPOCH + Duration::from_millis(info.taken_at_ms);
    println!(
        "wrote snapshot {} ({size} bytes), taken {}, layout [{}]",
        a.file.display(),
        humantime::format_rfc3339_millis(taken),
        info.layout
    );
    let mut fastest: Vec<(&String, &f64)> = info
        .rates
        .iter()
        .filter(|(k, r)| !k.starts_with("hwm/") && **r > 0.0)
        .collect();
    fastest.sort_by(|x, y| y.1.total_cmp(x.1));
    if info.taken_after_loss {
        println!("rescue snapshot: the node's state file was lost and it had stopped issuing; this covers everything it handed out (stop the node, then `idgen state restore`)");
    } else if !info.rates_known {
        println!("issue rates: not recorded (offline backup)");
    } else if fastest.is_empty() {
        println!("issue rates: no counter was moving");
    } else {
        for (k, r) in fastest.iter().take(5) {
            println!("issue rate {k}: {r:.1}/s");
        }
    }
    Ok(())
}

fn state_restore(a: RestoreArgs) -> anyhow::Result<()> {
    use idgen::store::snapshot;
    let config = embedded_config(&a.config, "restore")?;
    let now_ms = SystemClock.now_millis();
    if config.state_path.exists() {
        bail!(
            "state file {} exists; refusing to overwrite it (restore is for a lost state file: move this one away first if you really mean to replace it)",
            config.state_path.display()
        );
    }
    let info = snapshot::inspect(&a.backup)?;
    let layout = config.layout.to_string();
    if info.layout != layout {
        bail!(
            "backup {} was taken for layout [{}] but the config says [{layout}]; restore it with the config the node ran with",
            a.backup.display(),
            info.layout
        );
    }
    let suggestion = snapshot::suggest(&info, now_ms);
    let Some(skip) = a.skip_ahead else {
        bail!(
            "--skip-ahead is required: every segment, lease and strict counter must move past what the node handed out after this snapshot.\nsuggested: --skip-ahead {} ({})",
            suggestion.margin,
            suggestion.explanation
        );
    };
    if skip < suggestion.margin {
        eprintln!(
            "warning: --skip-ahead {skip} is below the suggested {} ({})",
            suggestion.margin, suggestion.explanation
        );
    }
    // Every worker's mark moves to at least now + reserve: a restart right
    // after a crash still starts above every ID the lost file covered.
    let hwm_floor_ms = now_ms.saturating_add(config.hwm_reserve.as_millis() as u64);
    let r = snapshot::restore(&a.backup, &config.state_path, &layout, skip, hwm_floor_ms)?;
    println!(
        "restored {} from {} (taken {} ago): {} segment tags, {} lease token counters and {} strict counters moved forward by {skip}; counters the snapshot did not hold start above {}; {} high-water marks raised to at least {} ms",
        config.state_path.display(),
        a.backup.display(),
        humantime::format_duration(Duration::from_secs(
            now_ms.saturating_sub(info.taken_at_ms) / 1000
        )),
        r.segments,
        r.lease_tokens,
        r.strict_keys,
        r.floor,
        r.hwm_marks,
        r.hwm_floor_ms
    );
    Ok(())
}

async fn gen(a: GenArgs) -> anyhow::Result<()> {
    let mode = idgen::id::Mode::parse(&a.mode)?;
    let mode = idgen::server::grpc::mode_to_proto(mode) as i32;
    let mut client = IdGenClient::new(cli::client::channel(&a.addr, a.timeout).await?);
    let ids = if a.count == 1 {
        let request = proto::GenIdRequest { mode, tag: a.tag };
        vec![
            cli::client::call(a.timeout, client.gen_id(request))
                .await?
                .id,
        ]
    } else {
        let mut ids = Vec::with_capacity(a.count as usize);
        let mut batch = a.batch;
        while ids.len() < a.count as usize {
            let count = (a.count - ids.len() as u32).min(batch);
            let request = proto::GenIdsRequest {
                mode,
                tag: a.tag.clone(),
                count,
            };
            match client.gen_ids(request).await {
                Ok(r) => ids.extend(r.into_inner().ids),
                // The server's server.max_batch is below --batch: it says
                // its maximum (and reserved nothing), so ask again in
                // calls of that size.
                Err(s) if server_max_batch(&s).is_some_and(|max| max < count) => {
                    batch = server_max_batch(&s).unwrap_or(1);
                }
                Err(s) => return Err(cli::client::status_error(s)),
            }
        }
        ids
    };
    if a.json {
        let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
        outln!("{}", serde_json::json!({ "ids": ids }))?;
    } else {
        let mut out = String::with_capacity(ids.len() * 20);
        for id in ids {
            out.push_str(&id.to_string());
            out.push('\n');
        }
        cli::output::write(&out)?;
    }
    Ok(())
}

/// The largest batch a server accepts, from its INVALID_ARGUMENT answer
/// "count must be between 1 and N, ...".
fn server_max_batch(s: &tonic::Status) -> Option<u32> {
    if s.code() != tonic::Code::InvalidArgument {
        return None;
    }
    let rest = s.message().strip_prefix("count must be between 1 and ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|max| *max > 0)
}

fn decode(a: DecodeArgs) -> anyhow::Result<()> {
    let Ok(id) = a.id.parse::<u64>() else {
        bail!("{:?} is not a decimal 64-bit unsigned integer", a.id);
    };
    let d = match Mode::parse(&a.mode)? {
        Mode::Snowflake => {
            let file = FileConfig::load(a.config.as_deref())?;
            let layout = file.layout(SystemClock.now_millis())?;
            decode_snowflake(&layout, id)?
        }
        Mode::Lease => idgen::server::issuer::decode_lease(id)?,
        other => bail!("mode {other} IDs are plain numbers with no fields to decode"),
    };
    if a.json {
        outln!("{}", serde_json::to_string(&d)?)?;
    } else if let (Some(zone), Some(token)) = (d.zone, d.token) {
        outln!(
            "id {}\nzone {zone}\ntoken {token}\nsequence {}",
            d.id,
            d.sequence
        )?;
    } else {
        outln!(
            "id {}\ntime {} ({} ms)\ndatacenter {}\nworker {}\nsequence {}",
            d.id,
            d.time,
            d.unix_millis,
            d.datacenter,
            d.worker,
            d.sequence
        )?;
    }
    Ok(())
}

async fn bench_cmd(a: BenchArgs) -> anyhow::Result<()> {
    let opts = BenchOptions {
        target: a.addr.clone(),
        connections: a.connections,
        concurrency: a.concurrency,
        duration: a.duration,
        warmup: a.warmup,
        batch: a.batch,
        mode: idgen::id::Mode::parse(&a.mode)?,
        tag: a.tag.clone(),
    };
    let mut reports: Vec<(&str, bench::BenchReport)> = Vec::new();
    if a.baseline {
        let base = BaselineServer::start(2)?;
        let base_opts = BenchOptions {
            target: format!("http://{}", base.addr),
            ..opts.clone()
        };
        for _ in 0..a.rounds.max(1) {
            reports.push(("bare tonic counter", bench::run(&base_opts).await?));
            reports.push(("idgen", bench::run(&opts).await?));
        }
    } else {
        reports.push(("idgen", bench::run(&opts).await?));
    }
    if a.json {
        let all: Vec<_> = reports.iter().map(|(l, r)| r.to_json(l)).collect();
        outln!("{}", serde_json::Value::Array(all))?;
    } else {
        for (label, r) in &reports {
            outln!("{}", r.summary(label))?;
        }
        if a.baseline {
            let median = |label: &str, f: fn(&bench::BenchReport) -> f64| {
                let v: Vec<f64> = reports
                    .iter()
                    .filter(|(l, _)| *l == label)
                    .map(|(_, r)| f(r))
                    .collect();
                bench::median(v)
            };
            let (b_calls, o_calls) = (
                median("bare tonic counter", bench::BenchReport::calls_per_sec),
                median("idgen", bench::BenchReport::calls_per_sec),
            );
            let (b_ids, o_ids) = (
                median("bare tonic counter", bench::BenchReport::ids_per_sec),
                median("idgen", bench::BenchReport::ids_per_sec),
            );
            outln!(
                "medians over {} rounds: bare {b_calls:.0} calls/s {b_ids:.0} IDs/s; idgen {o_calls:.0} calls/s {o_ids:.0} IDs/s; idgen/bare {:.1}% of calls/s, {:.1}% of IDs/s",
                a.rounds.max(1),
                100.0 * o_calls / b_calls,
                100.0 * o_ids / b_ids
            )?;
        }
    }
    let bad = reports.iter().any(|(_, r)| r.order_violations > 0);
    if bad {
        bail!("IDs went backwards or repeated within a task: see order violations");
    }
    Ok(())
}

/// `idgen admin`: a thin client of `idgen.v1.Admin`.
mod admin {
    use anyhow::{bail, Context};
    use serde_json::{json, Value};
    use tonic::metadata::{Ascii, MetadataValue};
    use tonic::service::interceptor::{InterceptedService, Interceptor};
    use tonic::transport::Channel;
    use tonic::{Request, Status};

    use crate::cli::output::outln;
    use idgen::proto::{self, admin_client::AdminClient, HolderKind};

    use super::{AdminArgs, AdminCommand, LayoutCommand, StrictCommand, TagsCommand};

    /// Adds `authorization: Bearer <token>` to every call (when a token
    /// was given; without one the server answers UNAUTHENTICATED).
    #[derive(Clone)]
    pub(super) struct Bearer(Option<MetadataValue<Ascii>>);

    impl Interceptor for Bearer {
        fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
            if let Some(h) = &self.0 {
                req.metadata_mut().insert("authorization", h.clone());
            }
            Ok(req)
        }
    }

    pub(super) type Client = AdminClient<InterceptedService<Channel, Bearer>>;

    /// The token from --token / IDGEN_ADMIN__TOKEN or --token-file (or the
    /// deprecated IDGEN_ADMIN_TOKEN).
    fn token(a: &AdminArgs) -> anyhow::Result<Option<String>> {
        token_from(a.token.as_deref(), a.token_file.as_deref())
    }

    /// The token given inline, or read from a file.
    pub(super) fn token_from(
        token: Option<&str>,
        token_file: Option<&std::path::Path>,
    ) -> anyhow::Result<Option<String>> {
        if let Some(t) = token {
            return Ok(Some(t.trim().to_owned()));
        }
        let Some(path) = token_file else {
            return Ok(match std::env::var("IDGEN_ADMIN_TOKEN") {
                Ok(t) if !t.trim().is_empty() => {
                    eprintln!("warning: IDGEN_ADMIN_TOKEN is deprecated; set IDGEN_ADMIN__TOKEN, the name the server reads too");
                    Some(t.trim().to_owned())
                }
                _ => None,
            });
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --token-file {}", path.display()))?;
        let t = text.trim();
        if t.is_empty() {
            bail!("--token-file {} is empty", path.display());
        }
        Ok(Some(t.to_owned()))
    }

    async fn connect(a: &AdminArgs) -> anyhow::Result<Client> {
        connect_to(&a.addr, token(a)?, a.timeout).await
    }

    /// An admin client of `addr`, sending `token` as a bearer token; the
    /// connection and every call are bounded by `timeout`.
    pub(super) async fn connect_to(
        addr: &str,
        token: Option<String>,
        timeout: std::time::Duration,
    ) -> anyhow::Result<Client> {
        let header = match token {
            Some(t) => {
                let mut v = MetadataValue::try_from(format!("Bearer {t}")).map_err(|_| {
                    anyhow::anyhow!(
                        "the admin token has characters a header cannot carry (use printable ASCII)"
                    )
                })?;
                // Kept out of HTTP/2 header compression tables.
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        let channel = crate::cli::client::channel(addr, timeout).await?;
        Ok(AdminClient::with_interceptor(channel, Bearer(header)))
    }

    /// The gRPC code and message, for the error line.
    fn failed(s: Status) -> anyhow::Error {
        crate::cli::client::status_error(s)
    }

    fn tag_json(t: &proto::SegmentTag) -> Value {
        json!({
            "tag": t.tag,
            "max_id": t.max_id.to_string(),
            "step": t.step,
            "description": t.description,
            "created": t.created,
            "updated": t.updated,
        })
    }

    fn tag_line(t: &proto::SegmentTag) -> String {
        format!(
            "{}\tmax_id {}\tstep {}\tcreated {}\tupdated {}\tdescription {:?}",
            t.tag, t.max_id, t.step, t.created, t.updated, t.description
        )
    }

    fn kind_name(kind: i32) -> &'static str {
        match HolderKind::try_from(kind) {
            Ok(HolderKind::Worker) => "worker",
            Ok(HolderKind::LeaseToken) => "token",
            _ => "unknown",
        }
    }

    fn holder_json(h: &proto::Holder) -> Value {
        json!({
            "kind": kind_name(h.kind),
            "datacenter": h.datacenter,
            "zone": h.zone,
            "id": h.id,
            "instance": h.instance,
            "address": h.address,
            "since": h.since,
            "session": h.session,
            "state": h.state,
            "reserved": h.reserved.to_string(),
        })
    }

    fn holder_line(h: &proto::Holder) -> String {
        let place = match HolderKind::try_from(h.kind) {
            Ok(HolderKind::LeaseToken) => format!("token {}/{}", h.zone, h.id),
            _ => format!("worker {}/{}", h.datacenter, h.id),
        };
        format!(
            "{place}\t{}\tinstance {}\taddress {}\tsince {}\tsession {}",
            h.state,
            h.instance,
            h.address,
            h.since,
            if h.session.is_empty() {
                "-"
            } else {
                &h.session
            }
        )
    }

    fn layout_json(l: &proto::IdLayout) -> Value {
        json!({
            "preset": l.preset,
            "epoch": l.epoch,
            "epoch_ms": l.epoch_ms,
            "time_unit_ms": l.time_unit_ms,
            "time_bits": l.time_bits,
            "datacenter_bits": l.datacenter_bits,
            "worker_bits": l.worker_bits,
            "sequence_bits": l.sequence_bits,
        })
    }

    fn layout_line(l: &proto::IdLayout) -> String {
        format!(
            "preset {} / time {}x{}ms / datacenter {} / worker {} / sequence {} / epoch {}",
            l.preset,
            l.time_bits,
            l.time_unit_ms,
            l.datacenter_bits,
            l.worker_bits,
            l.sequence_bits,
            l.epoch
        )
    }

    fn record_out(r: &proto::GetLayoutResponse) -> anyhow::Result<(Value, String)> {
        let l = r
            .layout
            .as_ref()
            .context("the server answered without the layout")?;
        let mut text = format!(
            "generation {}{}: {}",
            r.generation,
            if r.changing {
                " (a change is being checked)"
            } else {
                ""
            },
            layout_line(l)
        );
        if r.floor_ms > 0 {
            text.push_str(&format!("\nstarts no lower than {} ms", r.floor_ms));
        }
        let mut history = Vec::new();
        for h in &r.history {
            if let Some(hl) = &h.layout {
                text.push_str(&format!(
                    "\nearlier: generation {}: {} (replaced at {} ms, IDs up to {})",
                    h.generation,
                    layout_line(hl),
                    h.replaced_ms,
                    h.max_id
                ));
                history.push(json!({
                    "generation": h.generation,
                    "layout": layout_json(hl),
                    "replaced_ms": h.replaced_ms,
                    "max_id": h.max_id.to_string(),
                }));
            }
        }
        Ok((
            json!({
                "generation": r.generation,
                "layout": layout_json(l),
                "floor_ms": r.floor_ms,
                "changing": r.changing,
                "history": history,
            }),
            text,
        ))
    }

    fn tag_of(t: Option<proto::SegmentTag>) -> anyhow::Result<proto::SegmentTag> {
        t.context("the server answered without the tag")
    }

    /// Runs one admin command and prints its answer.
    pub async fn run(a: AdminArgs) -> anyhow::Result<()> {
        let mut c = connect(&a).await?;
        let out: (Value, String) = match &a.command {
            AdminCommand::Tags(TagsCommand::Create {
                tag,
                initial,
                step,
                description,
            }) => {
                let r = c
                    .create_tag(proto::CreateTagRequest {
                        tag: tag.clone(),
                        initial: *initial,
                        step: *step,
                        description: description.clone(),
                    })
                    .await
                    .map_err(failed)?
                    .into_inner();
                let t = tag_of(r.tag)?;
                let mut text = format!("created {}", tag_line(&t));
                if !r.note.is_empty() {
                    text.push_str(&format!("\nnote: {}", r.note));
                }
                (json!({"tag": tag_json(&t), "note": r.note}), text)
            }
            AdminCommand::Tags(TagsCommand::Update {
                tag,
                step,
                description,
                max_id,
            }) => {
                if step.is_none() && description.is_none() && max_id.is_none() {
                    bail!("nothing to change: pass --step, --description or --max-id");
                }
                let r = c
                    .update_tag(proto::UpdateTagRequest {
                        tag: tag.clone(),
                        step: *step,
                        description: description.clone(),
                        max_id: *max_id,
                    })
                    .await
                    .map_err(failed)?
                    .into_inner();
                let t = tag_of(r.tag)?;
                (
                    json!({"tag": tag_json(&t)}),
                    format!("updated {}", tag_line(&t)),
                )
            }
            AdminCommand::Tags(TagsCommand::Get { tag }) => {
                let r = c
                    .get_tag(proto::GetTagRequest { tag: tag.clone() })
                    .await
                    .map_err(failed)?
                    .into_inner();
                let t = tag_of(r.tag)?;
                (json!({"tag": tag_json(&t)}), tag_line(&t))
            }
            AdminCommand::Tags(TagsCommand::List) => {
                let r = c
                    .list_tags(proto::ListTagsRequest {})
                    .await
                    .map_err(failed)?
                    .into_inner();
                let lines: Vec<String> = r.tags.iter().map(tag_line).collect();
                let text = if lines.is_empty() {
                    "no tags".to_owned()
                } else {
                    lines.join("\n")
                };
                for u in &r.unreadable {
                    eprintln!(
                        "warning: unreadable segment record {:?}: {}",
                        u.key, u.error
                    );
                }
                let unreadable: Vec<Value> = r
                    .unreadable
                    .iter()
                    .map(|u| json!({"key": u.key, "error": u.error}))
                    .collect();
                (
                    json!({"tags": r.tags.iter().map(tag_json).collect::<Vec<_>>(), "unreadable": unreadable}),
                    text,
                )
            }
            AdminCommand::Tags(TagsCommand::Delete { tag }) => {
                let r = c
                    .delete_tag(proto::DeleteTagRequest { tag: tag.clone() })
                    .await
                    .map_err(failed)?
                    .into_inner();
                (
                    json!({"tag": r.tag, "max_id": r.max_id.to_string(), "note": r.note}),
                    format!("deleted {} (max_id {})\nnote: {}", r.tag, r.max_id, r.note),
                )
            }
            AdminCommand::Holders => {
                let r = c
                    .list_holders(proto::ListHoldersRequest {})
                    .await
                    .map_err(failed)?
                    .into_inner();
                let mut text = format!("backend {}", r.backend);
                for h in &r.holders {
                    text.push('\n');
                    text.push_str(&holder_line(h));
                }
                (
                    json!({
                        "backend": r.backend,
                        "holders": r.holders.iter().map(holder_json).collect::<Vec<_>>(),
                    }),
                    text,
                )
            }
            AdminCommand::Release(r) => {
                let (kind, datacenter, zone) = match r.kind.as_str() {
                    "worker" => {
                        if r.zone.is_some() {
                            bail!("--zone is for --kind token; a worker id has --datacenter");
                        }
                        (HolderKind::Worker, r.datacenter.unwrap_or(0), 0)
                    }
                    "token" | "lease_token" | "lease-token" => {
                        if r.datacenter.is_some() {
                            bail!("--datacenter is for --kind worker; a lease token has --zone");
                        }
                        (HolderKind::LeaseToken, 0, r.zone.unwrap_or(0))
                    }
                    other => bail!("--kind {other:?}: use worker or token"),
                };
                if r.force && !a.json {
                    eprintln!("releasing with --force: waiting out the holder's lock-delay (up to 60 s)...");
                }
                let resp = c
                    .force_release(proto::ForceReleaseRequest {
                        kind: kind as i32,
                        datacenter,
                        zone,
                        id: r.id,
                        force: r.force,
                    })
                    .await
                    .map_err(failed)?
                    .into_inner();
                (
                    json!({
                        "released": resp.released,
                        "waited_ms": resp.waited_ms,
                        "message": resp.message,
                        "holder": resp.holder.as_ref().map(holder_json),
                    }),
                    resp.message,
                )
            }
            AdminCommand::Strict(StrictCommand::SetStep { namespace, step }) => {
                let r = c
                    .set_strict_step(proto::SetStrictStepRequest {
                        namespace: namespace.clone(),
                        step: *step,
                    })
                    .await
                    .map_err(failed)?
                    .into_inner();
                (
                    json!({"namespace": r.namespace, "step": r.step, "previous": r.previous}),
                    format!(
                        "namespace {}: step {} (was {}); other nodes use it within 10 s",
                        r.namespace, r.step, r.previous
                    ),
                )
            }
            AdminCommand::Strict(StrictCommand::GetStep { namespace }) => {
                let r = c
                    .get_strict_step(proto::GetStrictStepRequest {
                        namespace: namespace.clone(),
                    })
                    .await
                    .map_err(failed)?
                    .into_inner();
                let origin = if r.stored { "set" } else { "server default" };
                (
                    json!({"namespace": r.namespace, "step": r.step, "stored": r.stored}),
                    format!("namespace {}: step {} ({origin})", r.namespace, r.step),
                )
            }
            AdminCommand::Layout(LayoutCommand::Get) => {
                let r = c
                    .get_layout(proto::GetLayoutRequest {})
                    .await
                    .map_err(failed)?
                    .into_inner();
                record_out(&r)?
            }
            AdminCommand::Layout(LayoutCommand::Set {
                preset,
                epoch,
                time_unit,
                time_bits,
                datacenter_bits,
                worker_bits,
                sequence_bits,
                expect_generation,
            }) => {
                let time_unit_ms = match time_unit {
                    Some(d) if d.subsec_nanos() % 1_000_000 != 0 => {
                        bail!("--time-unit must be a whole number of milliseconds")
                    }
                    Some(d) => Some(d.as_millis() as u64),
                    None => None,
                };
                let r = c
                    .set_layout(proto::SetLayoutRequest {
                        preset: preset.clone(),
                        epoch: epoch.clone(),
                        time_unit_ms,
                        time_bits: *time_bits,
                        datacenter_bits: *datacenter_bits,
                        worker_bits: *worker_bits,
                        sequence_bits: *sequence_bits,
                        expect_generation: expect_generation.unwrap_or(0),
                    })
                    .await
                    .map_err(failed)?
                    .into_inner();
                let record = r
                    .record
                    .as_ref()
                    .context("the server answered without the record")?;
                let (mut v, text) = record_out(record)?;
                v["old_max_id"] = json!(r.old_max_id.to_string());
                v["new_first_id"] = json!(r.new_first_id.to_string());
                (
                    v,
                    format!(
                        "layout changed: {text}\nevery earlier ID is at most {}; the new layout starts at {} or above\nnodes still on the old layout have stopped issuing: restart every node with the new [layout]",
                        r.old_max_id, r.new_first_id
                    ),
                )
            }
            AdminCommand::Strict(StrictCommand::List) => {
                let r = c
                    .list_strict_namespaces(proto::ListStrictNamespacesRequest {})
                    .await
                    .map_err(failed)?
                    .into_inner();
                let mut text = format!("default step {}", r.default_step);
                for n in &r.namespaces {
                    text.push_str(&format!("\n{}\tstep {}", n.namespace, n.step));
                }
                let list: Vec<Value> = r
                    .namespaces
                    .iter()
                    .map(|n| json!({"namespace": n.namespace, "step": n.step}))
                    .collect();
                (
                    json!({"namespaces": list, "default_step": r.default_step}),
                    text,
                )
            }
            AdminCommand::Strict(StrictCommand::Keys { namespace }) => {
                let r = c
                    .list_strict_keys(proto::ListStrictKeysRequest {
                        namespace: namespace.clone(),
                    })
                    .await
                    .map_err(failed)?
                    .into_inner();
                let mut text = format!(
                    "namespace {}: {} live keys (limit {})",
                    r.namespace,
                    r.keys.len(),
                    r.max_keys
                );
                for k in &r.keys {
                    text.push_str(&format!("\n{}\t{}", k.key, k.value));
                }
                let list: Vec<Value> = r
                    .keys
                    .iter()
                    .map(|k| json!({"key": k.key, "value": k.value.to_string()}))
                    .collect();
                (
                    json!({"namespace": r.namespace, "keys": list, "max_keys": r.max_keys}),
                    text,
                )
            }
            AdminCommand::Strict(StrictCommand::Delete { key }) => {
                let r = c
                    .delete_strict_key(proto::DeleteStrictKeyRequest { key: key.clone() })
                    .await
                    .map_err(failed)?
                    .into_inner();
                (
                    json!({"key": r.key, "last_value": r.last_value.to_string(), "note": r.note}),
                    r.note,
                )
            }
        };
        if a.json {
            outln!("{}", out.0)?;
        } else {
            outln!("{}", out.1)?;
        }
        Ok(())
    }
}
