//! `idgen bench`: load-test a running node over gRPC, optionally against a
//! bare tonic server in this process for comparison.

use anyhow::bail;

use idgen_loadgen::{self as bench, BaselineServer, BenchOptions, BenchReport};

use super::args::BenchArgs;
use super::output::outln;

/// The label of the bare tonic counter's runs.
const BARE: &str = "bare tonic counter";

/// Runs the load (alternating with the baseline, `--rounds` times, when
/// `--baseline`), prints each run, and fails if any IDs went backwards
/// (unless `--unordered`: hidden IDs).
pub async fn run(a: BenchArgs) -> anyhow::Result<()> {
    if a.discovery.discover.is_some() {
        return run_discovered(a).await;
    }
    let opts = BenchOptions {
        target: a.addr.clone(),
        connections: a.connections,
        concurrency: a.concurrency,
        duration: a.duration,
        warmup: a.warmup,
        batch: a.batch,
        mode: idgen::server::grpc::mode_to_proto(idgen::id::Mode::parse(&a.mode)?),
        tag: a.tag.clone(),
        format: a.format.clone(),
        format_params: a.param.clone(),
        small_callers: a.small_callers,
        small_batch: a.small_batch,
        uuid: a.uuid,
    };
    let mut reports: Vec<(&str, BenchReport)> = Vec::new();
    if a.baseline {
        let base = BaselineServer::start(2)?;
        let base_opts = BenchOptions {
            target: format!("http://{}", base.addr),
            ..opts.clone()
        };
        for _ in 0..a.rounds.max(1) {
            reports.push((BARE, bench::run(&base_opts).await?));
            reports.push(("idgen", load(&a, &opts).await?));
        }
    } else {
        reports.push(("idgen", load(&a, &opts).await?));
    }
    if a.json {
        let all: Vec<_> = reports.iter().map(|(l, r)| r.to_json(l)).collect();
        outln!("{}", serde_json::Value::Array(all))?;
    } else {
        for (label, r) in &reports {
            outln!("{}", r.summary(label))?;
        }
        if a.baseline {
            print_medians(&reports, a.rounds.max(1))?;
        }
    }
    let bad = !a.unordered && reports.iter().any(|(_, r)| r.order_violations > 0);
    if bad {
        bail!("IDs went backwards or repeated within a task: see order violations");
    }
    Ok(())
}

/// One run against `--addr` on fresh connections dialled like every other
/// command (https:// with `--ca`, else plaintext). One GenId on each
/// connection first: a node that speaks the other protocol fails here,
/// with the reason, instead of counting errors for the whole run.
async fn load(a: &BenchArgs, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    let timeout = std::time::Duration::from_secs(30);
    let mut channels = Vec::with_capacity(a.connections);
    for _ in 0..a.connections.max(1) {
        let channel = super::client::channel(&a.addr, timeout, &a.tls).await?;
        let mut probe = idgen::proto::id_gen_client::IdGenClient::new(channel.clone());
        super::client::call(timeout, probe.gen_id(idgen::proto::GenIdRequest::default()))
            .await
            .map_err(|e| anyhow::anyhow!("{}: the first call failed: {e}", a.addr))?;
        channels.push(channel);
    }
    Ok(bench::run_on(opts, channels).await?)
}

/// The medians of the bare and idgen runs, and idgen's share of the bare
/// server's throughput (the machine's noise hits both alike).
fn print_medians(reports: &[(&str, BenchReport)], rounds: usize) -> std::io::Result<()> {
    let median = |label: &str, f: fn(&BenchReport) -> f64| {
        let v: Vec<f64> = reports
            .iter()
            .filter(|(l, _)| *l == label)
            .map(|(_, r)| f(r))
            .collect();
        bench::median(v)
    };
    let (b_calls, o_calls) = (
        median(BARE, BenchReport::calls_per_sec),
        median("idgen", BenchReport::calls_per_sec),
    );
    let (b_ids, o_ids) = (
        median(BARE, BenchReport::ids_per_sec),
        median("idgen", BenchReport::ids_per_sec),
    );
    outln!(
        "medians over {rounds} rounds: bare {b_calls:.0} calls/s {b_ids:.0} IDs/s; idgen {o_calls:.0} calls/s {o_ids:.0} IDs/s; idgen/bare {:.1}% of calls/s, {:.1}% of IDs/s",
        100.0 * o_calls / b_calls,
        100.0 * o_ids / b_ids
    )
}

/// What one `--discover consul` load task measured: calls, IDs, errors
/// and its latency histogram (µs).
type TaskOutcome = (u64, u64, u64, hdrhistogram::Histogram<u64>);

/// The tags one load task of [`run_discovered`] calls on: `tag` itself
/// (one key), or `tag-0` to `tag-<keys-1>`, task `i` starting at `i` and
/// moving on by the number of tasks after each call, so the tasks cover
/// every key evenly.
struct Spread {
    tag: String,
    keys: u32,
    at: u64,
    step: u64,
}

impl Spread {
    fn next_tag(&mut self) -> String {
        if self.keys <= 1 {
            return self.tag.clone();
        }
        let tag = format!("{}-{}", self.tag, self.at % u64::from(self.keys));
        self.at = self.at.wrapping_add(self.step);
        tag
    }
}

/// What the calls of [`run_discovered`] ask for: IDs of a mode, or UUIDs.
#[derive(Clone, Copy)]
enum Asked {
    Ids(idgen_client::Mode),
    Uuids,
}

/// One call of a `--discover` load task: how many IDs it returned.
async fn discovered_call(
    client: &idgen_client::Client,
    asked: Asked,
    tag: &str,
    batch: u32,
) -> Result<u64, idgen_client::Error> {
    match asked {
        Asked::Uuids if batch <= 1 => client.gen_uuid().await.map(|_| 1),
        Asked::Uuids => client.gen_uuids(batch).await.map(|v| v.len() as u64),
        Asked::Ids(mode) if batch <= 1 => client.gen_id(mode, tag).await.map(|_| 1),
        Asked::Ids(mode) => client
            .gen_ids(mode, tag, batch)
            .await
            .map(|v| v.len() as u64),
    }
}

/// One load task of [`run_discovered`]: one call at a time until `until`,
/// counting only calls started after `measure_from`.
async fn discovered_task(
    client: idgen_client::Client,
    asked: Asked,
    mut tags: Spread,
    batch: u32,
    measure_from: std::time::Instant,
    until: std::time::Instant,
) -> TaskOutcome {
    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .expect("histogram bounds");
    let (mut calls, mut ids, mut errors) = (0u64, 0u64, 0u64);
    loop {
        let t = std::time::Instant::now();
        if t >= until {
            break;
        }
        let tag = tags.next_tag();
        let got = discovered_call(&client, asked, &tag, batch).await;
        if t < measure_from {
            continue;
        }
        match got {
            Ok(n) => {
                calls += 1;
                ids += n;
                h.saturating_record(t.elapsed().as_micros() as u64);
            }
            Err(_) => errors += 1,
        }
    }
    (calls, ids, errors, h)
}

/// `--discover consul`: the load goes through the idgen-client crate to
/// every passing node Consul lists (power of two choices, failover), so it
/// measures the whole cluster. `--concurrency` tasks each make one call at
/// a time (`GenId`, or `GenIds` of `--batch`); errors are counted, not
/// retried past the client's deadline.
async fn run_discovered(a: BenchArgs) -> anyhow::Result<()> {
    use std::time::{Duration, Instant};
    let client =
        super::gen::discovered_client(&a.discovery, &a.tls, Duration::from_secs(5)).await?;
    let mode = idgen::server::grpc::mode_to_proto(idgen::id::Mode::parse(&a.mode)?);
    let mode = idgen_client::Mode::try_from(mode as i32)
        .map_err(|_| anyhow::anyhow!("mode {} is not known to the client", a.mode))?;
    let asked = if a.uuid {
        Asked::Uuids
    } else {
        Asked::Ids(mode)
    };
    let nodes = client.nodes().len();
    let start = Instant::now();
    let measure_from = start + a.warmup;
    let until = measure_from + a.duration;
    let tasks: Vec<_> = (0..a.concurrency.max(1))
        .map(|i| {
            let (client, batch) = (client.clone(), a.batch);
            let tags = Spread {
                tag: a.tag.clone(),
                keys: a.keys,
                at: i as u64,
                step: a.concurrency.max(1) as u64,
            };
            tokio::spawn(discovered_task(
                client,
                asked,
                tags,
                batch,
                measure_from,
                until,
            ))
        })
        .collect();
    let mut report = BenchReport {
        calls: 0,
        ids: 0,
        errors: 0,
        order_violations: 0,
        elapsed: a.duration,
        p50: Duration::ZERO,
        p99: Duration::ZERO,
        p999: Duration::ZERO,
        max: Duration::ZERO,
        classes: Vec::new(),
    };
    let mut all = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for t in tasks {
        let (calls, ids, errors, h) = t.await?;
        report.calls += calls;
        report.ids += ids;
        report.errors += errors;
        all.add(h)?;
    }
    let us = |v: u64| Duration::from_micros(v);
    report.p50 = us(all.value_at_quantile(0.5));
    report.p99 = us(all.value_at_quantile(0.99));
    report.p999 = us(all.value_at_quantile(0.999));
    report.max = us(all.max());
    let label = format!("idgen cluster ({nodes} nodes via Consul)");
    if a.json {
        outln!("{}", serde_json::Value::Array(vec![report.to_json(&label)]))?;
    } else {
        outln!("{}", report.summary(&label))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Spread;
    use std::collections::HashMap;

    fn spread(tag: &str, keys: u32, task: u64, tasks: u64) -> Spread {
        Spread {
            tag: tag.into(),
            keys,
            at: task,
            step: tasks,
        }
    }

    #[test]
    fn one_key_is_the_tag_itself() {
        let mut s = spread("orders/k", 1, 3, 48);
        assert_eq!(s.next_tag(), "orders/k");
        assert_eq!(s.next_tag(), "orders/k");
    }

    #[test]
    fn the_tasks_cover_every_key_evenly() {
        let (keys, tasks) = (100u32, 48u64);
        let mut spreads: Vec<Spread> = (0..tasks).map(|i| spread("o/m", keys, i, tasks)).collect();
        let mut seen: HashMap<String, u32> = HashMap::new();
        // 25 calls per task: 1,200 calls, 12 per key.
        for _ in 0..25 {
            for s in &mut spreads {
                *seen.entry(s.next_tag()).or_default() += 1;
            }
        }
        assert_eq!(seen.len(), keys as usize);
        assert!(seen.values().all(|&n| n == 12), "{seen:?}");
        assert!(seen.contains_key("o/m-0") && seen.contains_key("o/m-99"));
    }
}
