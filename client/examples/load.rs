//! Application-side load through the client, for scripts/bench-client.sh:
//! `threads` threads call `next_id` (prefetched snowflake) or `gen_id`
//! (one call per ID) for `seconds`, and it prints one JSON line with the
//! IDs per second and the latency percentiles of single calls, refill and
//! failover stalls included, plus a histogram of the calls above 1 ms
//! (`stalls_over_1ms`). Those include the times the operating system took
//! the core away in the middle of a call; `buffer_waits_over_1ms` counts
//! only the calls that found the prefetch buffer empty and waited for a
//! refill (`buffer_waits`: all such calls), which is what the client can
//! help.
//!
//! By default each thread calls as fast as it can, so it always ends up
//! waiting for the servers: that measures the most one thread gets.
//! `--rate N` paces each thread at N IDs/s instead (an application with a
//! steady load), and `--warmup S` leaves the first S seconds out of every
//! figure (the buffer's batch and lanes growing to the load): together they
//! measure whether the client keeps ahead in steady state. The pacing time
//! itself is never counted as a wait; only the calls are timed.
//!
//! ```text
//! cargo run --release -p idgen-client --example load -- \
//!     --consul http://127.0.0.1:8500 --threads 4 --seconds 5 --mode prefetch
//! cargo run --release -p idgen-client --example load -- \
//!     --threads 1 --seconds 10 --warmup 2 --rate 6000000
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
    /// IDs per second per thread, or 0: as fast as it can.
    rate: u64,
    /// Seconds at the start left out of every figure.
    warmup: u64,
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
        rate: 0,
        warmup: 0,
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
            "--rate" => a.rate = v()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--warmup" => a.warmup = v()?.parse().map_err(|e| format!("--warmup: {e}"))?,
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

/// One thread's IDs taken, latencies of every call and of the calls that
/// found the buffer empty (waits for a refill), IDs kept for the distinct
/// check, errors.
type Outcome = (u64, Histogram<u64>, Histogram<u64>, Vec<u64>, u64);

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
    let (mut h, mut w) = (new_histogram(), new_histogram());
    let mut all = Vec::new();
    for (n, hist, waits, kept, e) in results {
        total += n;
        errors += e;
        h.add(hist).unwrap();
        w.add(waits).unwrap();
        all.extend(kept);
    }
    let distinct = if a.check_distinct {
        let set: HashSet<u64> = all.iter().copied().collect();
        Some(set.len() == all.len())
    } else {
        None
    };
    let (stalls, waits) = (stalls(&h), stalls(&w));
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{{\"mode\": \"{}\", \"threads\": {}, \"refills_in_flight\": {}, \"rate\": {}, \"warmup_s\": {}, \"ids\": {total}, \"ids_per_sec\": {:.0}, \"errors\": {errors}, \"p50_us\": {:.3}, \"p99_us\": {:.3}, \"p999_us\": {:.3}, \"max_ms\": {:.3}, \"distinct\": {}, \"stalls_over_1ms\": {{{}}}, \"buffer_waits\": {}, \"buffer_waits_over_1ms\": {{{}}}}}",
        if a.prefetch { "prefetch" } else { "call" },
        a.threads,
        a.refills_in_flight,
        a.rate,
        a.warmup,
        total as f64 / elapsed,
        us(0.5),
        us(0.99),
        us(0.999),
        h.max() as f64 / 1e6,
        distinct.map_or("null".into(), |d| d.to_string()),
        stalls.join(", "),
        w.len(),
        waits.join(", ")
    );
}

/// Runs `a.threads` threads calling for `a.warmup + a.seconds`; one outcome
/// a thread, of the last `a.seconds` only.
fn run(client: &BlockingClient, a: &Args) -> Vec<Outcome> {
    let start = Instant::now();
    let measured_from = start + Duration::from_secs(a.warmup);
    let until = measured_from + Duration::from_secs(a.seconds);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..a.threads)
            .map(|_| {
                s.spawn(move || {
                    let prefetcher = client.prefetcher(Mode::Snowflake, "").expect("prefetcher");
                    let (mut h, mut w) = (new_histogram(), new_histogram());
                    let (mut n, mut errors, mut kept) = (0u64, 0u64, Vec::new());
                    let (mut taken, mut warming) = (0u64, a.warmup > 0);
                    'run: loop {
                        // Look at the clock every 1,024 calls: reading it
                        // per call would cost as much as the call.
                        for _ in 0..1024 {
                            let t = Instant::now();
                            let (got, empty) = if !a.prefetch {
                                (client.gen_id(Mode::Snowflake, ""), false)
                            } else if let Some(id) = prefetcher.prefetcher().try_next() {
                                (Ok(id), false)
                            } else {
                                (prefetcher.next_id(), true)
                            };
                            let took = t.elapsed().as_nanos() as u64;
                            h.saturating_record(took);
                            if empty {
                                w.saturating_record(took);
                            }
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
                        taken += 1024;
                        let now = pace(start, taken, a.rate);
                        if warming && now >= measured_from {
                            // The warm-up is over: forget it.
                            warming = false;
                            (n, errors) = (0, 0);
                            kept.clear();
                            h.reset();
                            w.reset();
                        }
                        if now >= until {
                            break 'run;
                        }
                    }
                    (n, h, w, kept, errors)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    })
}

/// Nanoseconds, 3 significant digits, up to 60 s.
fn new_histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap()
}

/// With a `rate` (IDs/s), waits until `taken` IDs are due since `start`
/// (a thread behind its schedule goes on at once, and so catches up);
/// returns the time after. Spins: a sleep would wake too late at these
/// rates, and the thread has a core to itself anyway.
fn pace(start: Instant, taken: u64, rate: u64) -> Instant {
    let mut now = Instant::now();
    if rate == 0 {
        return now;
    }
    let due = start + Duration::from_nanos(taken.saturating_mul(1_000_000_000) / rate);
    while now < due {
        std::hint::spin_loop();
        now = Instant::now();
    }
    now
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
