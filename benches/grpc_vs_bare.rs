//! idgen over gRPC against a bare tonic server that returns a counter, in
//! one run, with the same load generator (`idgen_loadgen`).
//!
//! Each server runs on its own 2-thread runtime and thread, as a separate
//! process would; the load generator has its own runtime. Prints calls/s,
//! IDs/s, latency percentiles and the idgen/bare ratio for unary GenId
//! (1 connection x 64 calls in flight) and for GenIds batches of 1000.
//!
//! Each case alternates the two servers `IDGEN_BENCH_ROUNDS` times (default
//! 3) and compares medians, since the machine's noise hits both alike.
//! `IDGEN_BENCH_SECS` sets the measured seconds per run (default 5).

use std::time::Duration;

use idgen_loadgen::{self as bench, BaselineServer, BenchOptions, BenchReport};

mod common;
use common::IdgenServer;

fn main() {
    let secs: u64 = std::env::var("IDGEN_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let bare = BaselineServer::start(2).expect("baseline server");
    let ours = IdgenServer::start();
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime");
    let cases = [
        ("unary GenId, 1 conn x 64", 1u32),
        ("GenIds x1000, 1 conn x 64", 1000),
    ];
    for (name, batch) in cases {
        let run = |addr: std::net::SocketAddr| -> BenchReport {
            let opts = BenchOptions {
                target: format!("http://{addr}"),
                connections: 1,
                concurrency: 64,
                duration: Duration::from_secs(secs),
                warmup: Duration::from_secs(1),
                batch,
                mode: idgen::proto::Mode::Snowflake,
                tag: String::new(),
                format: None,
                format_params: Vec::new(),
                small_callers: 0,
                small_batch: 0,
                uuid: false,
            };
            client.block_on(bench::run(&opts)).expect("bench run")
        };
        let rounds: usize = std::env::var("IDGEN_BENCH_ROUNDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3);
        let (mut b_calls, mut o_calls, mut b_ids, mut o_ids) = (vec![], vec![], vec![], vec![]);
        println!("== {name}");
        for _ in 0..rounds.max(1) {
            let b = run(bare.addr);
            let o = run(ours.addr);
            println!("{}", b.summary("bare tonic counter"));
            println!("{}", o.summary("idgen"));
            assert_eq!(o.order_violations, 0, "idgen IDs went backwards");
            b_calls.push(b.calls_per_sec());
            o_calls.push(o.calls_per_sec());
            b_ids.push(b.ids_per_sec());
            o_ids.push(o.ids_per_sec());
        }
        let (bc, oc) = (bench::median(b_calls), bench::median(o_calls));
        let (bi, oi) = (bench::median(b_ids), bench::median(o_ids));
        println!(
            "medians: bare {bc:.0} calls/s {bi:.0} IDs/s; idgen {oc:.0} calls/s {oi:.0} IDs/s; idgen/bare {:.1}% of calls/s, {:.1}% of IDs/s",
            100.0 * oc / bc,
            100.0 * oi / bi
        );
    }
}
