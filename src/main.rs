//! The `idgen` command: serve, init, gen, decode, bench.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use tokio::net::TcpListener;

use idgen::bench::{self, BaselineServer, BenchOptions};
use idgen::config::{Config, FileConfig, Overrides};
use idgen::id::{Clock, OffsetClock, SystemClock};
use idgen::proto::{self, id_gen_client::IdGenClient};
use idgen::server::{decode_snowflake, Node};
use idgen::store::EmbeddedStore;

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
    /// Create the state file (refuses to overwrite an existing one).
    Init(ConfigArgs),
    /// Ask a running server for IDs.
    Gen(GenArgs),
    /// Split an ID into its parts, offline, under the configured layout.
    Decode(DecodeArgs),
    /// Load-test a running server over gRPC.
    Bench(BenchArgs),
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
    /// Server URL.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// How many IDs.
    #[arg(long, short = 'n', default_value_t = 1)]
    count: u32,
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
    /// Mode to ask for: snowflake or segment.
    #[arg(long, default_value = "snowflake")]
    mode: String,
    /// Tag (segment mode).
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
    }
}

fn init_logging(config: &Config) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log_level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if config.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let overrides = Overrides {
        grpc_listen: a.grpc_listen,
        http_listen: a.http_listen,
        state_path: a.config.state,
        datacenter_id: a.datacenter_id,
        worker_id: a.worker_id,
    };
    let clock: Arc<dyn Clock> = match a.test_clock_offset_ms {
        0 => Arc::new(SystemClock),
        ms => Arc::new(OffsetClock::new(SystemClock, ms.saturating_mul(1000))),
    };
    let mut config = Config::load(a.config.config.as_deref(), &overrides, clock.now_millis())?;
    init_logging(&config);
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
        startup_ms = started.elapsed().as_secs_f64() * 1000.0,
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

fn init(a: ConfigArgs) -> anyhow::Result<()> {
    let overrides = Overrides {
        state_path: a.state,
        ..Overrides::default()
    };
    let config = Config::load(a.config.as_deref(), &overrides, SystemClock.now_millis())?;
    if !matches!(config.backend, idgen::config::Backend::Embedded) {
        bail!("idgen init creates the embedded state file; with store.backend = \"consul\" there is nothing to create (nodes claim worker ids at start)");
    }
    EmbeddedStore::create(&config.state_path, &config.layout.to_string())?;
    println!(
        "created state file {} for layout [{}]",
        config.state_path.display(),
        config.layout
    );
    Ok(())
}

async fn gen(a: GenArgs) -> anyhow::Result<()> {
    let mode = idgen::id::Mode::parse(&a.mode)?;
    let mode = idgen::server::grpc::mode_to_proto(mode) as i32;
    let mut client = IdGenClient::connect(a.addr.clone())
        .await
        .with_context(|| format!("cannot connect to {}", a.addr))?;
    let ids = if a.count == 1 {
        let resp = client
            .gen_id(proto::GenIdRequest { mode, tag: a.tag })
            .await
            .map_err(status_error)?;
        vec![resp.into_inner().id]
    } else {
        client
            .gen_ids(proto::GenIdsRequest {
                mode,
                tag: a.tag,
                count: a.count,
            })
            .await
            .map_err(status_error)?
            .into_inner()
            .ids
    };
    if a.json {
        let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
        println!("{}", serde_json::json!({ "ids": ids }));
    } else {
        let mut out = String::with_capacity(ids.len() * 20);
        for id in ids {
            out.push_str(&id.to_string());
            out.push('\n');
        }
        print!("{out}");
    }
    Ok(())
}

fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", s.code(), s.message())
}

fn decode(a: DecodeArgs) -> anyhow::Result<()> {
    let Ok(id) = a.id.parse::<u64>() else {
        bail!("{:?} is not a decimal 64-bit unsigned integer", a.id);
    };
    let file = FileConfig::load(a.config.as_deref())?;
    let layout = file.layout(SystemClock.now_millis())?;
    let d = decode_snowflake(&layout, id)?;
    if a.json {
        println!("{}", serde_json::to_string(&d)?);
    } else {
        println!(
            "id {}\ntime {} ({} ms)\ndatacenter {}\nworker {}\nsequence {}",
            d.id, d.time, d.unix_millis, d.datacenter, d.worker, d.sequence
        );
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
        println!("{}", serde_json::Value::Array(all));
    } else {
        for (label, r) in &reports {
            println!("{}", r.summary(label));
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
            println!(
                "medians over {} rounds: bare {b_calls:.0} calls/s {b_ids:.0} IDs/s; idgen {o_calls:.0} calls/s {o_ids:.0} IDs/s; idgen/bare {:.1}% of calls/s, {:.1}% of IDs/s",
                a.rounds.max(1),
                100.0 * o_calls / b_calls,
                100.0 * o_ids / b_ids
            );
        }
    }
    let bad = reports.iter().any(|(_, r)| r.order_violations > 0);
    if bad {
        bail!("IDs went backwards or repeated within a task: see order violations");
    }
    Ok(())
}
