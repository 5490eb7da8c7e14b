//! `idgen bench`: load-test a running node over gRPC, optionally against a
//! bare tonic server in this process for comparison.

use anyhow::bail;

use idgen::bench::{self, BaselineServer, BenchOptions, BenchReport};

use super::args::BenchArgs;
use super::output::outln;

/// The label of the bare tonic counter's runs.
const BARE: &str = "bare tonic counter";

/// Runs the load (alternating with the baseline, `--rounds` times, when
/// `--baseline`), prints each run, and fails if any IDs went backwards.
pub async fn run(a: BenchArgs) -> anyhow::Result<()> {
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
    let mut reports: Vec<(&str, BenchReport)> = Vec::new();
    if a.baseline {
        let base = BaselineServer::start(2)?;
        let base_opts = BenchOptions {
            target: format!("http://{}", base.addr),
            ..opts.clone()
        };
        for _ in 0..a.rounds.max(1) {
            reports.push((BARE, bench::run(&base_opts).await?));
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
            print_medians(&reports, a.rounds.max(1))?;
        }
    }
    let bad = reports.iter().any(|(_, r)| r.order_violations > 0);
    if bad {
        bail!("IDs went backwards or repeated within a task: see order violations");
    }
    Ok(())
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
