//! `idgen serve`: load the config, start logging, bind, start the node
//! and serve until a signal.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use tokio::net::TcpListener;

use idgen::config::{Config, LogFormat};
use idgen::id::{Clock, OffsetClock, SystemClock};
use idgen::node::{FormatConfigSource, Node};

use super::args::ServeArgs;

/// `RUST_LOG`, when set, wins over `log.level`; it is held to the same
/// rule, so a typo there cannot silence the node either.
pub fn log_filter(config: &Config) -> anyhow::Result<String> {
    match std::env::var("RUST_LOG") {
        Ok(filter) => {
            idgen::config::check_log_filter(&filter)
                .map_err(|problem| anyhow::anyhow!("environment variable RUST_LOG: {problem}"))?;
            Ok(filter)
        }
        Err(std::env::VarError::NotPresent) => Ok(config.log.level.clone()),
        Err(std::env::VarError::NotUnicode(_)) => {
            bail!("environment variable RUST_LOG is not valid UTF-8")
        }
    }
}

/// Logs to stderr, as text or JSON lines, filtered by `log.level` (or
/// `RUST_LOG`).
fn init_logging(config: &Config) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(log_filter(config)?)?;
    use std::io::IsTerminal;
    let json = config.log.format == LogFormat::Json;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(!json && config.log.color.enabled(std::io::stderr().is_terminal()))
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
    Ok(())
}

/// Reads the config file's `[[formats]]` again, as `serve` loaded it
/// (the same file, environment and flags), for SIGHUP reloads.
fn config_reader(
    path: Option<std::path::PathBuf>,
    overrides: idgen::config::Overrides,
    clock: Arc<dyn Clock>,
) -> FormatConfigSource {
    Arc::new(move || {
        Config::load(path.as_deref(), &overrides, clock.now_millis())
            .map(|c| c.formatted.formats)
            .map_err(|e| e.to_string())
    })
}

/// Runs the ID service until a signal, then shuts down in order.
pub async fn run(a: ServeArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let overrides = a.overrides();
    let clock: Arc<dyn Clock> = match a.test_clock_offset_ms {
        0 => Arc::new(SystemClock),
        ms => Arc::new(OffsetClock::new(SystemClock, ms.saturating_mul(1000))),
    };
    let mut config = Config::load(a.config.config.as_deref(), &overrides, clock.now_millis())?;
    init_logging(&config)?;
    // Before anything slow: a signal during start-up then means "stop once
    // started", never an abrupt default-action exit.
    let mut stop =
        Box::pin(idgen::node::shutdown::signal().context("cannot install signal handlers")?);
    if a.test_clock_offset_ms != 0 {
        tracing::warn!(
            offset_ms = a.test_clock_offset_ms,
            "testing only: the clock is shifted from the system clock"
        );
    }
    // Bound first, so the advertised address is the real one (port 0 picks
    // a free port); nothing is accepted until the node is ready.
    let grpc = TcpListener::bind(config.server.grpc_listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on server.grpc_listen {}",
                config.server.grpc_listen
            )
        })?;
    let http = TcpListener::bind(config.server.http_listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on server.http_listen {}",
                config.server.http_listen
            )
        })?;
    if config.node.advertise.is_none() {
        config.node.advertise = Some(grpc.local_addr()?);
    }
    // The bound port (port 0 picks one): advertised as Meta.metrics_port.
    config.server.http_listen = http.local_addr()?;
    let reread = config_reader(a.config.config.clone(), overrides, Arc::clone(&clock));
    let node = tokio::select! {
        node = Node::start(config.clone(), clock) => node.context("cannot start")?,
        () = &mut stop => {
            // Nothing was issued; a claimed worker id frees itself when its
            // session expires.
            tracing::warn!("stopped by a signal while starting");
            bail!("stopped by a signal while starting");
        }
    };
    node.reread_formats_with(reread);
    tracing::info!(
        // Rounded to 0.1 ms: a log field, not a measurement.
        startup_ms = (started.elapsed().as_secs_f64() * 10_000.0).round() / 10.0,
        grpc = %grpc.local_addr()?,
        http = %http.local_addr()?,
        "ready"
    );
    // systemd (Type=notify): ready now, stopping at the signal, watchdog
    // pings meanwhile; all no-ops without NOTIFY_SOCKET.
    let notifier = idgen::node::systemd::Notifier::from_env();
    notifier.ready(&format!(
        "serving gRPC on {}, HTTP on {}",
        grpc.local_addr()?,
        http.local_addr()?
    ));
    let watchdog = notifier.spawn_watchdog();
    let stop = async move {
        stop.await;
        notifier.stopping();
    };
    let report = node.serve(grpc, http, stop).await?;
    if let Some(w) = watchdog {
        w.abort();
    }
    if !report.drained {
        tracing::warn!("some calls were cut off at shutdown");
    }
    Ok(())
}
