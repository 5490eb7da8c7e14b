//! Strict calls per second against the Consul test server with its Raft
//! latency model, in one process (no gRPC): the store-level figure of
//! node-local combining. Not a test; it asserts nothing but uniqueness.
//!
//! ```text
//! cargo run --example strict_consul_load -- \
//!     [--nodes 1] [--concurrency 64] [--keys 1] [--secs 5] \
//!     [--raft-write-ms 2] [--consistent-read-ms 0.5]
//! ```
//!
//! Prints one line: `nodes= c= keys= calls/s= p50_us= p99_us= txns= errors=`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use consul_testserver::{Config, TestConsul};
use idgen::consul::{ConsulClient, ConsulConfig};
use idgen::id::strict::StrictKey;
use idgen::store::kv_paths::ClusterPaths;
use idgen::store::strict::{ConsulStrictStore, StrictStore};

fn arg(args: &[String], name: &str, default: f64) -> f64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let nodes = arg(&args, "--nodes", 1.0) as usize;
    let concurrency = arg(&args, "--concurrency", 64.0) as usize;
    let keys = arg(&args, "--keys", 1.0) as usize;
    let secs = arg(&args, "--secs", 5.0);
    let consul = TestConsul::start(Config {
        raft_write_delay: Duration::from_secs_f64(arg(&args, "--raft-write-ms", 2.0) / 1e3),
        consistent_read_delay: Duration::from_secs_f64(
            arg(&args, "--consistent-read-ms", 0.5) / 1e3,
        ),
        ..Config::default()
    })
    .await?;
    let keys: Arc<Vec<StrictKey>> = Arc::new(
        (0..keys)
            .map(|i| StrictKey::parse(&format!("perf/k{i}")))
            .collect::<Result<_, _>>()?,
    );
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..nodes {
        let client = ConsulClient::new(ConsulConfig {
            address: format!("http://{}", consul.addr()),
            ..ConsulConfig::default()
        })?;
        let store = Arc::new(ConsulStrictStore::new(
            client,
            ClusterPaths::new("idgen", "perf"),
        ));
        for t in 0..concurrency {
            let (store, keys) = (Arc::clone(&store), Arc::clone(&keys));
            tasks.push(tokio::spawn(async move {
                let (mut lat, mut values, mut errors) = (Vec::new(), Vec::new(), 0u64);
                let mut c = t;
                while Instant::now() < deadline {
                    let i = c % keys.len();
                    let k = &keys[i];
                    c += 7;
                    let start = Instant::now();
                    match store.advance(k, 1, 1).await {
                        Ok(v) => {
                            lat.push(start.elapsed());
                            values.push((i, v.first));
                        }
                        Err(_) => errors += 1,
                    }
                }
                (lat, values, errors)
            }));
        }
    }
    let (mut lat, mut seen, mut errors) = (Vec::new(), HashSet::new(), 0);
    for t in tasks {
        let (l, v, e) = t.await?;
        lat.extend(l);
        errors += e;
        for value in v {
            assert!(seen.insert(value), "value {value:?} handed out twice");
        }
    }
    lat.sort();
    let q = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)));
    let us = |d: Option<&Duration>| d.map_or(0, |d| d.as_micros());
    println!(
        "nodes={nodes} c={concurrency} keys={} calls/s={:.0} p50_us={} p99_us={} txns={} errors={errors}",
        keys.len(),
        lat.len() as f64 / secs,
        us(q(0.5)),
        us(q(0.99)),
        consul.request_count(None, "txn"),
    );
    consul.shutdown().await;
    Ok(())
}
