//! Application-side load through the client, for scripts/bench-client.sh:
//! `threads` threads call `next_id` (prefetched snowflake) or `gen_id`
//! (one call per ID) for `seconds`, and it prints one JSON line with the
//! IDs per second and the latency percentiles of single calls, refill and
//! failover stalls included, plus a histogram of the calls above 1 ms.
//!
//! ```text
//! cargo run --release -p idgen-client --example load -- \
//!     --consul http://127.0.0.1:8500 --threads 4 --seconds 5 --mode prefetch
//! ```

use std::collections::HashSet;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use idgen_client::blocking::BlockingClient;
use idgen_client::{Client, ConsulDiscovery, Mode, PrefetchConfig};

struct Args {
    consul: String,
    threads: usize,
    seconds: u64,
    prefetch: bool,
    deadline: Duration,
    check_distinct: bool,
    /// `PrefetchConfig::refills_in_flight`; 1 = one refill at a time.
    refills_in_flight: u32,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        consul: "http://127.0.0.1:8500".into(),
        threads: 2,
        seconds: 5,
        prefetch: true,
        deadline: Duration::from_secs(2),
        check_distinct: false,
        refills_in_flight: PrefetchConfig::default().refills_in_flight,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--consul" => a.consul = v()?,
            "--threads" => a.threads = v()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--seconds" => a.seconds = v()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--deadline-ms" => {
                a.deadline =
                    Duration::from_millis(v()?.parse().map_err(|e| format!("--deadline-ms: {e}"))?)
            }
            "--mode" => {
                a.prefetch = match v()?.as_str() {
                    "prefetch" => true,
                    "call" => false,
                    other => return Err(format!("--mode prefetch|call, not {other}")),
                }
            }
            "--check-distinct" => a.check_distinct = true,
            "--refills-in-flight" => {
                a.refills_in_flight = v()?
                    .parse()
                    .map_err(|e| format!("--refills-in-flight: {e}"))?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// One thread's IDs taken, latencies, IDs kept for the distinct check, errors.
type Outcome = (u64, Histogram<u64>, Vec<u64>, u64);

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("load: {e}");
            std::process::exit(2);
        }
    };
    let client = BlockingClient::connect(
        Client::builder()
            .consul(ConsulDiscovery::new(&a.consul).wait(Duration::from_secs(5)))
            .deadline(a.deadline)
            .set_aside(Duration::from_millis(500))
            .prefetch(PrefetchConfig {
                refills_in_flight: a.refills_in_flight,
                ..PrefetchConfig::default()
            }),
    )
    .unwrap_or_else(|e| {
        eprintln!("load: {e}");
        std::process::exit(1)
    });
    let results = run(&client, &a);
    let elapsed = a.seconds as f64;
    let mut total = 0;
    let mut errors = 0;
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    let mut all = Vec::new();
    for (n, hist, kept, e) in results {
        total += n;
        errors += e;
        h.add(hist).unwrap();
        all.extend(kept);
    }
    let distinct = if a.check_distinct {
        let set: HashSet<u64> = all.iter().copied().collect();
        Some(set.len() == all.len())
    } else {
        None
    };
    let stalls = stalls(&h);
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{{\"mode\": \"{}\", \"threads\": {}, \"refills_in_flight\": {}, \"ids\": {total}, \"ids_per_sec\": {:.0}, \"errors\": {errors}, \"p50_us\": {:.3}, \"p99_us\": {:.3}, \"p999_us\": {:.3}, \"max_ms\": {:.3}, \"distinct\": {}, \"stalls_over_1ms\": {{{}}}}}",
        if a.prefetch { "prefetch" } else { "call" },
        a.threads,
        a.refills_in_flight,
        total as f64 / elapsed,
        us(0.5),
        us(0.99),
        us(0.999),
        h.max() as f64 / 1e6,
        distinct.map_or("null".into(), |d| d.to_string()),
        stalls.join(", ")
    );
}

/// Runs `a.threads` threads calling for `a.seconds`; one outcome a thread.
fn run(client: &BlockingClient, a: &Args) -> Vec<Outcome> {
    let until = Instant::now() + Duration::from_secs(a.seconds);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..a.threads)
            .map(|_| {
                s.spawn(move || {
                    let prefetcher = client.prefetcher(Mode::Snowflake, "").expect("prefetcher");
                    // Nanoseconds, 3 significant digits, up to 60 s.
                    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
                    let (mut n, mut errors, mut kept) = (0u64, 0u64, Vec::new());
                    'run: loop {
                        // Look at the clock every 1,024 calls: reading it
                        // per call would cost as much as the call.
                        for _ in 0..1024 {
                            let t = Instant::now();
                            let got = if a.prefetch {
                                prefetcher.next_id()
                            } else {
                                client.gen_id(Mode::Snowflake, "")
                            };
                            h.saturating_record(t.elapsed().as_nanos() as u64);
                            match got {
                                Ok(id) => {
                                    n += 1;
                                    if a.check_distinct {
                                        kept.push(id);
                                    }
                                }
                                Err(e) => {
                                    errors += 1;
                                    eprintln!("load: {e}");
                                }
                            }
                        }
                        if Instant::now() >= until {
                            break 'run;
                        }
                    }
                    (n, h, kept, errors)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    })
}

/// Calls above 1 ms, by power-of-two millisecond buckets.
fn stalls(h: &Histogram<u64>) -> Vec<String> {
    let mut stalls = Vec::new();
    let mut lo = 1_000_000u64;
    while lo < 60_000_000_000 {
        let hi = lo * 2;
        let c: u64 = h
            .iter_recorded()
            .filter(|v| v.value_iterated_to() >= lo && v.value_iterated_to() < hi)
            .map(|v| v.count_at_value())
            .sum();
        if c > 0 {
            stalls.push(format!("\"{}-{}ms\": {c}", lo / 1_000_000, hi / 1_000_000));
        }
        lo = hi;
    }
    stalls
}
