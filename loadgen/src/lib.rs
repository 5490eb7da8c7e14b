//! The `idgen bench` load generator, and a bare gRPC server to measure it
//! against.
//!
//! The load generator opens `connections` HTTP/2 connections and keeps
//! `concurrency` calls in flight across them for `duration`, recording each
//! call's latency in an HDR histogram. It also checks what it gets back:
//! every call's IDs must be greater than the previous call's on the same
//! task, so a duplicate or a counter going backwards shows up as an error.
//! UUIDv7 runs (`GenUuid`, `GenUuids`) are checked the same way, in
//! 128-bit big-endian order (the order of their bytes).
//!
//! The baseline server answers the same `idgen.v1.IdGen` rpcs with a plain
//! atomic counter: the cost of tonic itself, which idgen is compared with.
//!
//! This crate sits outside the idgen library: it speaks only the
//! `idgen.v1` protocol (`idgen-proto`), so the library does not carry a
//! load generator and the generator does not reach into the server.

#![warn(missing_docs)]

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use idgen_proto as proto;
use proto::id_gen_client::IdGenClient;
use proto::id_gen_server::{IdGen, IdGenServer};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Server URL, e.g. `http://127.0.0.1:50051`.
    pub target: String,
    /// HTTP/2 connections to open.
    pub connections: usize,
    /// Calls in flight at once, spread over the connections.
    pub concurrency: usize,
    /// How long to measure.
    pub duration: Duration,
    /// How long to run before measuring.
    pub warmup: Duration,
    /// 0 or 1: unary `GenId`; above 1: `GenIds` with this `count`.
    pub batch: u32,
    /// The mode asked for (the binary maps its `--mode` to the wire enum).
    pub mode: proto::Mode,
    /// The tag (segment mode).
    pub tag: String,
    /// `GenFormatted` of this format (with `format_params`) instead of
    /// `GenId`/`GenIds`; `batch` is its count.
    pub format: Option<String>,
    /// Parameters of `format`.
    pub format_params: Vec<(String, String)>,
    /// How many of the `concurrency` tasks ask for `small_batch` IDs
    /// instead of `batch` (a mixed load: e.g. 63 x 1000 and 1 x 10); 0
    /// for none. Each size is reported on its own.
    pub small_callers: usize,
    /// The batch of the `small_callers` tasks (0 or 1: unary `GenId`).
    pub small_batch: u32,
    /// UUIDv7 instead of snowflake-style IDs: unary `GenUuid` for a batch
    /// of 0 or 1, else `GenUuids` of `batch` (16 bytes a UUID on the wire,
    /// against 8 for a `GenIds` ID, so the two runs show what the wider
    /// ID costs). `mode` and `tag` are not sent.
    pub uuid: bool,
}

/// The figures of the calls of one batch size in a mixed run.
#[derive(Debug, Clone)]
pub struct SizeClass {
    /// The batch these calls asked for (1: unary).
    pub batch: u32,
    /// Calls that succeeded during the measured window.
    pub calls: u64,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// Largest latency.
    pub max: Duration,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// Calls that succeeded during the measured window.
    pub calls: u64,
    /// IDs received during the measured window.
    pub ids: u64,
    /// Calls that failed (any status).
    pub errors: u64,
    /// IDs that were not greater than the previous ID on the same task.
    pub order_violations: u64,
    /// The measured window.
    pub elapsed: Duration,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// 99.9th percentile latency.
    pub p999: Duration,
    /// Largest latency.
    pub max: Duration,
    /// Per batch size, when the run mixed sizes (empty otherwise).
    pub classes: Vec<SizeClass>,
}

impl BenchReport {
    /// Successful calls per second.
    pub fn calls_per_sec(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }

    /// IDs per second.
    pub fn ids_per_sec(&self) -> f64 {
        self.ids as f64 / self.elapsed.as_secs_f64()
    }

    /// A one-paragraph human summary.
    pub fn summary(&self, label: &str) -> String {
        let mut text = self.overall(label);
        for c in &self.classes {
            text.push_str(&format!(
                "\n  batch {}: {} calls; latency p50 {:?} p99 {:?} max {:?}",
                c.batch, c.calls, c.p50, c.p99, c.max
            ));
        }
        text
    }

    fn overall(&self, label: &str) -> String {
        format!(
            "{label}: {:.0} calls/s, {:.0} IDs/s over {:.1} s; latency p50 {:?} p99 {:?} p999 {:?} max {:?}; {} errors, {} order violations",
            self.calls_per_sec(),
            self.ids_per_sec(),
            self.elapsed.as_secs_f64(),
            self.p50,
            self.p99,
            self.p999,
            self.max,
            self.errors,
            self.order_violations,
        )
    }

    /// The same figures as JSON.
    pub fn to_json(&self, label: &str) -> serde_json::Value {
        serde_json::json!({
            "label": label,
            "calls": self.calls,
            "ids": self.ids,
            "errors": self.errors,
            "order_violations": self.order_violations,
            "seconds": self.elapsed.as_secs_f64(),
            "calls_per_sec": self.calls_per_sec(),
            "ids_per_sec": self.ids_per_sec(),
            "p50_us": self.p50.as_micros() as u64,
            "p99_us": self.p99.as_micros() as u64,
            "p999_us": self.p999.as_micros() as u64,
            "max_us": self.max.as_micros() as u64,
            "classes": self.classes.iter().map(|c| serde_json::json!({
                "batch": c.batch,
                "calls": c.calls,
                "p50_us": c.p50.as_micros() as u64,
                "p99_us": c.p99.as_micros() as u64,
                "max_us": c.max.as_micros() as u64,
            })).collect::<Vec<_>>(),
        })
    }
}

/// The median of some figures (the mean of the middle two for an even
/// count; 0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Bad options.
    #[error("{0}")]
    Options(String),
    /// Could not connect.
    #[error("cannot connect to {target}: {error}")]
    Connect {
        /// The URL.
        target: String,
        /// What failed.
        error: String,
    },
}

/// A latency histogram in nanoseconds, 1 ns to 60 s, 3 significant digits.
fn new_histogram() -> Histogram<u64> {
    // Constant, valid bounds: this cannot fail.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("constant histogram bounds are valid")
}

struct TaskResult {
    batch: u32,
    hist: Histogram<u64>,
    calls: u64,
    ids: u64,
    errors: u64,
    order_violations: u64,
}

/// Runs the load on fresh plaintext connections to `opts.target` and
/// returns the measured figures.
pub async fn run(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    check_options(opts)?;
    let mut channels = Vec::with_capacity(opts.connections);
    for _ in 0..opts.connections {
        let endpoint = Endpoint::from_shared(opts.target.clone())
            .map_err(|e| BenchError::Options(format!("bad target {:?}: {e}", opts.target)))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5));
        let channel = endpoint.connect().await.map_err(|e| BenchError::Connect {
            target: opts.target.clone(),
            error: e.to_string(),
        })?;
        channels.push(channel);
    }
    run_on(opts, channels).await
}

fn check_options(opts: &BenchOptions) -> Result<(), BenchError> {
    if opts.connections == 0 || opts.concurrency == 0 {
        return Err(BenchError::Options(
            "connections and concurrency must be at least 1".into(),
        ));
    }
    if opts.small_callers >= opts.concurrency && opts.small_callers > 0 {
        return Err(BenchError::Options(
            "small callers must leave at least one caller of the main batch".into(),
        ));
    }
    if opts.duration.is_zero() {
        return Err(BenchError::Options("duration must be above zero".into()));
    }
    if opts.uuid && opts.format.is_some() {
        return Err(BenchError::Options(
            "UUIDs or formatted IDs, not both: drop the format or the uuid option".into(),
        ));
    }
    Ok(())
}

/// Runs the load on `channels` (connected by the caller, e.g. over TLS);
/// the `--concurrency` tasks are spread over them.
pub async fn run_on(
    opts: &BenchOptions,
    channels: Vec<Channel>,
) -> Result<BenchReport, BenchError> {
    check_options(opts)?;
    if channels.is_empty() {
        return Err(BenchError::Options(
            "no connection to run the load on".into(),
        ));
    }
    let begin = Instant::now();
    let measure_from = begin + opts.warmup;
    let end = measure_from + opts.duration;
    let tasks: Vec<_> = (0..opts.concurrency)
        .map(|i| {
            let client = IdGenClient::new(channels[i % channels.len()].clone());
            let batch = if i >= opts.concurrency - opts.small_callers {
                opts.small_batch
            } else {
                opts.batch
            };
            let call = Call {
                batch,
                mode: opts.mode,
                tag: opts.tag.clone(),
                uuid: opts.uuid,
            };
            tokio::spawn(drive(
                client,
                call,
                formatted_request(opts),
                measure_from,
                end,
            ))
        })
        .collect();
    let mut hist = new_histogram();
    let mut by_batch: std::collections::BTreeMap<u32, (Histogram<u64>, u64)> = Default::default();
    let (mut calls, mut ids, mut errors, mut order_violations) = (0, 0, 0, 0);
    for t in tasks {
        let r = t
            .await
            .map_err(|e| BenchError::Options(format!("load task failed: {e}")))?;
        let _ = hist.add(&r.hist);
        let class = by_batch
            .entry(r.batch)
            .or_insert_with(|| (new_histogram(), 0));
        let _ = class.0.add(&r.hist);
        class.1 += r.calls;
        calls += r.calls;
        ids += r.ids;
        errors += r.errors;
        order_violations += r.order_violations;
    }
    let q = |p: f64| Duration::from_nanos(hist.value_at_quantile(p));
    Ok(BenchReport {
        calls,
        ids,
        errors,
        order_violations,
        elapsed: opts.duration,
        p50: q(0.5),
        p99: q(0.99),
        p999: q(0.999),
        max: Duration::from_nanos(hist.max()),
        classes: size_classes(by_batch),
    })
}

/// Per-size figures of a mixed run; none when every call had one size.
fn size_classes(
    by_batch: std::collections::BTreeMap<u32, (Histogram<u64>, u64)>,
) -> Vec<SizeClass> {
    if by_batch.len() < 2 {
        return Vec::new();
    }
    by_batch
        .into_iter()
        .map(|(batch, (h, calls))| SizeClass {
            batch: batch.max(1),
            calls,
            p50: Duration::from_nanos(h.value_at_quantile(0.5)),
            p99: Duration::from_nanos(h.value_at_quantile(0.99)),
            max: Duration::from_nanos(h.max()),
        })
        .collect()
}

/// The `GenFormatted` request of a formatted run.
fn formatted_request(opts: &BenchOptions) -> Option<proto::GenFormattedRequest> {
    opts.format.as_ref().map(|f| proto::GenFormattedRequest {
        format: f.clone(),
        params: opts.format_params.iter().cloned().collect(),
        count: opts.batch.max(1),
    })
}

/// What each call of one load task asks for.
struct Call {
    /// The count (0 or 1: the unary rpc).
    batch: u32,
    mode: proto::Mode,
    tag: String,
    /// `GenUuid`/`GenUuids` instead of `GenId`/`GenIds`.
    uuid: bool,
}

/// What one call returned, kept in its own width so the order check
/// compares UUIDs as 128-bit numbers without widening every snowflake ID.
enum Got {
    /// Snowflake-style IDs (or, for a formatted run, 1..=n: counted only).
    Ids(Vec<u64>),
    /// UUIDs, 16 bytes each, big-endian: their byte order is their order.
    Uuids(Vec<u8>),
}

impl Got {
    fn len(&self) -> usize {
        match self {
            Got::Ids(ids) => ids.len(),
            Got::Uuids(bytes) => bytes.len() / 16,
        }
    }
}

/// One call of a run: formatted IDs count (their order is not numeric).
async fn one_call(
    client: &mut IdGenClient<Channel>,
    call: &Call,
    formatted: Option<&proto::GenFormattedRequest>,
) -> Result<Got, tonic::Status> {
    if let Some(req) = formatted {
        let r = client.gen_formatted(req.clone()).await?.into_inner();
        // Counted, not ordered: a formatted ID is a string.
        return Ok(Got::Ids((1..=r.ids.len() as u64).collect()));
    }
    if call.uuid {
        return uuid_call(client, call.batch).await.map(Got::Uuids);
    }
    if call.batch <= 1 {
        client
            .gen_id(proto::GenIdRequest {
                mode: call.mode as i32,
                tag: call.tag.clone(),
            })
            .await
            .map(|resp| Got::Ids(vec![resp.into_inner().id]))
    } else {
        client
            .gen_ids(proto::GenIdsRequest {
                count: call.batch,
                mode: call.mode as i32,
                tag: call.tag.clone(),
            })
            .await
            .map(|resp| Got::Ids(resp.into_inner().ids))
    }
}

/// One `GenUuid` (batch 0 or 1) or `GenUuids` call: the UUIDs' bytes, or
/// an error when they are not whole 16-byte UUIDs (a server bug the run
/// must count, not hide).
async fn uuid_call(
    client: &mut IdGenClient<Channel>,
    batch: u32,
) -> Result<Vec<u8>, tonic::Status> {
    let bytes = if batch <= 1 {
        client
            .gen_uuid(proto::GenUuidRequest {})
            .await?
            .into_inner()
            .uuid
    } else {
        client
            .gen_uuids(proto::GenUuidsRequest {
                count: batch,
                with_text: false,
            })
            .await?
            .into_inner()
            .uuids
    };
    let want = batch.max(1) as usize * 16;
    if bytes.len() != want {
        return Err(tonic::Status::data_loss(format!(
            "asked for {} UUIDs ({want} bytes), got {} bytes",
            batch.max(1),
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// The last ID a task received, in the width of its calls.
#[derive(Default)]
struct Last {
    id: u64,
    uuid: u128,
}

impl Last {
    /// How many of `got` are not greater than the one before (the first
    /// against the previous call's last). Branch-free: hidden IDs come in
    /// no order, and a mispredicted branch per ID would charge them for it.
    fn violations(&mut self, got: &Got) -> u64 {
        let mut bad = 0;
        match got {
            Got::Ids(ids) => {
                for &id in ids {
                    bad += u64::from(id <= self.id);
                    self.id = id;
                }
            }
            Got::Uuids(bytes) => {
                for chunk in bytes.chunks_exact(16) {
                    let mut b = [0u8; 16];
                    b.copy_from_slice(chunk);
                    let uuid = u128::from_be_bytes(b);
                    bad += u64::from(uuid <= self.uuid);
                    self.uuid = uuid;
                }
            }
        }
        bad
    }
}

async fn drive(
    mut client: IdGenClient<Channel>,
    call: Call,
    formatted: Option<proto::GenFormattedRequest>,
    measure_from: Instant,
    end: Instant,
) -> TaskResult {
    let mut r = TaskResult {
        batch: call.batch,
        hist: new_histogram(),
        calls: 0,
        ids: 0,
        errors: 0,
        order_violations: 0,
    };
    let mut last = Last::default();
    loop {
        let started = Instant::now();
        if started >= end {
            return r;
        }
        let result = one_call(&mut client, &call, formatted.as_ref()).await;
        if formatted.is_some() {
            last = Last::default();
        }
        let finished = Instant::now();
        let measured = started >= measure_from && finished <= end;
        match result {
            Ok(got) => {
                r.order_violations += last.violations(&got);
                if measured {
                    r.calls += 1;
                    r.ids += got.len() as u64;
                    let _ = r.hist.record((finished - started).as_nanos() as u64);
                }
            }
            Err(_) if measured => r.errors += 1,
            Err(_) => {}
        }
    }
}

/// The bare baseline: `idgen.v1.IdGen` over an atomic counter.
#[derive(Debug, Default)]
pub struct CounterService {
    next: AtomicU64,
}

#[tonic::async_trait]
impl IdGen for CounterService {
    async fn gen_id(
        &self,
        _request: Request<proto::GenIdRequest>,
    ) -> Result<Response<proto::GenIdResponse>, Status> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(Response::new(proto::GenIdResponse { id }))
    }

    async fn gen_ids(
        &self,
        request: Request<proto::GenIdsRequest>,
    ) -> Result<Response<proto::GenIdsResponse>, Status> {
        let count = u64::from(request.into_inner().count.max(1));
        let first = self.next.fetch_add(count, Ordering::Relaxed) + 1;
        Ok(Response::new(proto::GenIdsResponse {
            ids: (first..first + count).collect(),
        }))
    }

    async fn decode_id(
        &self,
        _request: Request<proto::DecodeIdRequest>,
    ) -> Result<Response<proto::DecodeIdResponse>, Status> {
        Err(Status::unimplemented("the baseline server only counts"))
    }

    async fn gen_formatted(
        &self,
        _request: Request<proto::GenFormattedRequest>,
    ) -> Result<Response<proto::GenFormattedResponse>, Status> {
        Err(Status::unimplemented("the baseline server only counts"))
    }

    async fn parse_formatted(
        &self,
        _request: Request<proto::ParseFormattedRequest>,
    ) -> Result<Response<proto::ParseFormattedResponse>, Status> {
        Err(Status::unimplemented("the baseline server only counts"))
    }

    async fn get_format_counter(
        &self,
        _request: Request<proto::GetFormatCounterRequest>,
    ) -> Result<Response<proto::GetFormatCounterResponse>, Status> {
        Err(Status::unimplemented("the baseline server only counts"))
    }

    async fn gen_uuid(
        &self,
        _request: Request<proto::GenUuidRequest>,
    ) -> Result<Response<proto::GenUuidResponse>, Status> {
        let n = u128::from(self.next.fetch_add(1, Ordering::Relaxed) + 1);
        Ok(Response::new(proto::GenUuidResponse {
            uuid: n.to_be_bytes().to_vec(),
            text: String::new(),
        }))
    }

    /// Counter values as 16-byte runs: the wire cost of a UUID batch.
    async fn gen_uuids(
        &self,
        request: Request<proto::GenUuidsRequest>,
    ) -> Result<Response<proto::GenUuidsResponse>, Status> {
        let count = u64::from(request.into_inner().count.max(1));
        let first = self.next.fetch_add(count, Ordering::Relaxed) + 1;
        let mut uuids = Vec::with_capacity(count as usize * 16);
        for n in first..first + count {
            uuids.extend_from_slice(&u128::from(n).to_be_bytes());
        }
        Ok(Response::new(proto::GenUuidsResponse {
            uuids,
            texts: Vec::new(),
        }))
    }

    async fn decode_uuid(
        &self,
        _request: Request<proto::DecodeUuidRequest>,
    ) -> Result<Response<proto::DecodeUuidResponse>, Status> {
        Err(Status::unimplemented("the baseline server only counts"))
    }
}

/// Serves the baseline on `listener` until `shutdown` completes.
pub async fn serve_baseline(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(IdGenServer::new(CounterService::default()))
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}

/// A baseline server on its own runtime and thread (so it competes for the
/// CPU the way a separate server process would). Dropping it stops it.
pub struct BaselineServer {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BaselineServer {
    /// Starts the baseline on `127.0.0.1:0` with `workers` runtime threads.
    pub fn start(workers: usize) -> std::io::Result<Self> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .thread_name("baseline")
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("baseline-server".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(std_listener) else {
                        return;
                    };
                    let _ = serve_baseline(listener, async {
                        let _ = stopped.await;
                    })
                    .await;
                });
            })?;
        Ok(Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for BaselineServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two UUIDs as one `GenUuids` answer's bytes.
    fn uuids(values: &[u128]) -> Got {
        Got::Uuids(values.iter().flat_map(|v| v.to_be_bytes()).collect())
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("test runtime")
    }

    #[test]
    fn uuids_are_ordered_as_128_bit_numbers() {
        // Equal first halves: only the second half (where a UUIDv7 keeps
        // the low counter bits) decides.
        let high = 0x0190_0000_0000_7000_u128 << 64;
        let mut last = Last::default();
        assert_eq!(last.violations(&uuids(&[high | 5, high | 6])), 0);
        assert_eq!(last.violations(&uuids(&[high | 6])), 1, "a repeat");
        assert_eq!(last.violations(&uuids(&[high | 4])), 1, "backwards");
        // A larger first half wins whatever the second half holds.
        let next = (0x0190_0000_0000_7001_u128 << 64) | 1;
        assert_eq!(last.violations(&uuids(&[next])), 0);
    }

    #[test]
    fn a_uuid_call_asks_for_uuids_and_gets_16_bytes_each() {
        let server = BaselineServer::start(1).expect("baseline server");
        runtime().block_on(async {
            let channel = Endpoint::from_shared(format!("http://{}", server.addr))
                .expect("url")
                .connect()
                .await
                .expect("connect");
            let mut client = IdGenClient::new(channel);
            let mut call = Call {
                batch: 3,
                mode: proto::Mode::Snowflake,
                tag: String::new(),
                uuid: true,
            };
            let got = one_call(&mut client, &call, None).await.expect("GenUuids");
            assert!(matches!(&got, Got::Uuids(b) if b.len() == 48), "3 UUIDs");
            call.batch = 1;
            let got = one_call(&mut client, &call, None).await.expect("GenUuid");
            assert!(matches!(&got, Got::Uuids(b) if b.len() == 16), "1 UUID");
            call.uuid = false;
            let got = one_call(&mut client, &call, None).await.expect("GenId");
            assert!(matches!(&got, Got::Ids(ids) if ids.len() == 1), "1 ID");
        });
    }

    #[test]
    fn a_uuid_run_counts_every_uuid_in_order() {
        let server = BaselineServer::start(1).expect("baseline server");
        let opts = BenchOptions {
            target: format!("http://{}", server.addr),
            connections: 1,
            concurrency: 4,
            duration: Duration::from_millis(300),
            warmup: Duration::ZERO,
            batch: 1000,
            mode: proto::Mode::Snowflake,
            tag: String::new(),
            format: None,
            format_params: Vec::new(),
            small_callers: 0,
            small_batch: 0,
            uuid: true,
        };
        let report = runtime().block_on(run(&opts)).expect("run");
        assert!(report.calls > 0, "{report:?}");
        assert_eq!(report.ids, report.calls * 1000);
        assert_eq!((report.errors, report.order_violations), (0, 0));
        let both = BenchOptions {
            format: Some("orders".into()),
            ..opts
        };
        assert!(matches!(check_options(&both), Err(BenchError::Options(_))));
    }
}
