'use strict';
// App-visible IDs per second from @idgen/client's prefetch buffer (three
// nodes, one event loop) against ioredis INCR on a local redis-server from
// the same loop; run by scripts/bench-ts-client.sh, which starts both.
// Prints one line per round and the medians and ratio at the end.
//
// Then two runs of 2 M calls: a control without a kill, and SIGKILL of one
// node (VICTIM_PID) under the prefetch load; errors, duplicates, the
// longest nextId call (with the time the loop waited for a core and the
// collector's pauses in it) and p99.9.
//
//   node ts-vs-redis.js NODE1,NODE2,NODE3 REDIS_PORT ROUNDS VICTIM_PID
// With BENCH_RESULTS=FILE the medians are also appended to FILE as
// scripts/perf-report.sh's rows.
const { Client } = require('@idgen/client');
const Redis = require('ioredis');
const { appendFileSync, closeSync, openSync, readSync } = require('node:fs');
const { PerformanceObserver, constants, performance } = require('node:perf_hooks');

const [nodesArg, redisPort, roundsArg, victimArg] = process.argv.slice(2);
const rounds = Number(roundsArg ?? 5);
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function idgenRound(ids, n) {
  let last = 0n;
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i++) last = await ids.nextId();
  const secs = Number(process.hrtime.bigint() - start) / 1e9;
  if (last === 0n) throw new Error('no IDs');
  return n / secs;
}

async function redisRound(redis, n) {
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await redis.incr('bench:id');
  return n / (Number(process.hrtime.bigint() - start) / 1e9);
}

/**
 * How long this thread has waited for a core so far (ms on a run queue,
 * ready to run while the OS ran something else), from Linux's
 * /proc/thread-self/schedstat; NaN where there is none. Read into one
 * buffer, so the readings allocate nothing per call.
 */
function coreWaitClock() {
  let fd;
  try {
    fd = openSync('/proc/thread-self/schedstat', 'r');
  } catch {
    return { read: () => NaN, close() {} };
  }
  const buf = Buffer.alloc(64);
  return {
    read() {
      // "<ns on a core> <ns waiting on a run queue> <time slices>"
      const n = readSync(fd, buf, 0, buf.length, 0);
      let i = 0;
      while (i < n && buf[i] !== 0x20) i++;
      let ns = 0;
      for (i++; i < n && buf[i] !== 0x20; i++) ns = ns * 10 + (buf[i] - 0x30);
      return ns / 1e6;
    },
    close: () => closeSync(fd),
  };
}

/** perf_hooks' names for the collector's pauses (entry.detail.kind). */
const GC_KINDS = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'scavenge',
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'mark-compact',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental marking',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weak callbacks',
};

/** Calls per reading of the core-wait clock (a reading is a system call, ~2 us: 256 calls take ~0.1 ms). */
const WINDOW = 256;

/**
 * 2 M IDs, with a node killed -9 after the first 500 k when `victim` is
 * given (else the same load without a kill, as a control): errors,
 * duplicates, the longest call and p99.9, and what the longest call was
 * made of. Only the harness's typed arrays hold what it records (IDs,
 * call times), so the collector sees the client's garbage and the loop's
 * await, as in an application: no Set of IDs (it rehashed for 190 ms at a
 * million entries) and no bigint per timing (performance.now(), not
 * process.hrtime.bigint()).
 */
async function failover(ids, victim) {
  const total = 2_000_000;
  const got = new BigUint64Array(total);
  const took = new Float32Array(total);
  // The core-wait clock at the start of each window of WINDOW calls.
  const windows = Math.ceil(total / WINDOW);
  const waitAt = new Float64Array(windows + 1);
  const pauses = [];
  const gc = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) pauses.push([e.startTime, e.duration, GC_KINDS[e.detail?.kind] ?? 'other']);
  });
  gc.observe({ entryTypes: ['gc'] });
  const clock = coreWaitClock();
  let n = 0;
  let errors = 0;
  let longest = 0;
  let longestAt = 0;
  let longestI = 0;
  const waits0 = ids.waits;
  for (let i = 0; i < total; i++) {
    if (i % WINDOW === 0) waitAt[i / WINDOW] = clock.read();
    if (victim && i === total / 4) process.kill(victim, 'SIGKILL');
    const t = performance.now();
    try {
      got[n] = await ids.nextId();
      n++;
    } catch {
      errors++;
    }
    const ms = performance.now() - t;
    took[i] = ms;
    if (ms > longest) {
      longest = ms;
      longestAt = t;
      longestI = i;
    }
  }
  waitAt[windows] = clock.read();
  clock.close();
  const waits = ids.waits - waits0;
  // The observer hears of the last pauses after a turn of the loop.
  await new Promise((resolve) => setTimeout(resolve, 20));
  gc.disconnect();
  const w = Math.floor(longestI / WINDOW);
  const coreWait = waitAt[w + 1] - waitAt[w];
  let inGc = 0;
  const kinds = new Set();
  for (const [start, d, kind] of pauses) {
    const overlap = Math.max(0, Math.min(start + d, longestAt + longest) - Math.max(start, longestAt));
    inGc += overlap;
    if (overlap > 0) kinds.add(kind);
  }
  took.sort();
  const p999 = took[Math.min(total - 1, Math.floor(total * 0.999))];
  let over10 = 0;
  for (let i = total - 1; i >= 0 && took[i] > 10; i--) over10++;
  const sorted = got.subarray(0, n).sort();
  let dups = 0;
  for (let i = 1; i < n; i++) if (sorted[i] === sorted[i - 1]) dups++;
  const what = victim ? 'failover (SIGKILL of one of 3 nodes under prefetch)' : 'control (the same 2 M calls, no kill)';
  const wait = Number.isNaN(coreWait) ? 'core wait unknown' : `the window around it waited ${coreWait.toFixed(1)} ms for a core`;
  console.log(
    `${what}: ${errors} errors, ${dups} duplicates, longest nextId ${longest.toFixed(1)} ms` +
      ` (${wait}; GC pauses in it ${inGc.toFixed(1)} ms${kinds.size ? `: ${[...kinds].join(', ')}` : ''}),` +
      ` p99.9 ${p999.toFixed(3)} ms,` +
      ` calls over 10 ms: ${over10}, calls that waited for a refill: ${waits}`,
  );
  return { errors, dups, ms: longest, p999, coreWait, inGc };
}

/** With BENCH_RESULTS=FILE: rows for scripts/perf-report.sh (figure, value, unit; tab-separated). */
function record(rows) {
  if (!process.env.BENCH_RESULTS) return;
  appendFileSync(process.env.BENCH_RESULTS, rows.map((r) => `${r.join('\t')}\n`).join(''));
}

(async () => {
  const client = await Client.connect({ endpoints: nodesArg.split(','), prefetch: { batch: 10000 } });
  const ids = client.prefetcher('snowflake');
  const redis = new Redis({ host: '127.0.0.1', port: Number(redisPort), lazyConnect: true });
  await redis.connect();
  await idgenRound(ids, 500_000); // warm up: the buffer grows to its full batch and lanes
  await redisRound(redis, 20_000);
  const a = [];
  const r = [];
  for (let round = 1; round <= rounds; round++) {
    const [w0, r0] = [ids.waits, ids.refills];
    a.push(await idgenRound(ids, 3_000_000));
    const waited = `${ids.waits - w0} waits for a refill in ${ids.refills - r0} refills`;
    r.push(await redisRound(redis, 100_000));
    console.log(`round ${round}: idgen ${Math.round(a.at(-1)).toLocaleString('en')} IDs/s, ioredis INCR ${Math.round(r.at(-1)).toLocaleString('en')} /s (idgen: ${waited})`);
  }
  const ma = median(a);
  const mr = median(r);
  console.log(`median: idgen prefetch ${Math.round(ma).toLocaleString('en')} IDs/s; ioredis INCR ${Math.round(mr).toLocaleString('en')} /s; ratio ${(ma / mr).toFixed(1)}x`);
  redis.disconnect();
  record([
    ['ts-client-prefetch-1loop', ma.toFixed(0), 'IDs/s'],
    ['ioredis-incr-1loop', mr.toFixed(0), 'calls/s'],
  ]);
  if (victimArg) {
    const c = await failover(ids, undefined);
    const f = await failover(ids, Number(victimArg));
    const waited = Number.isNaN(f.coreWait) ? [] : [['ts-client-sigkill-longest-core-wait', f.coreWait.toFixed(1), 'ms']];
    record([
      ['ts-client-sigkill-longest', f.ms.toFixed(1), 'ms'],
      ['ts-client-sigkill-p999', (f.p999 * 1000).toFixed(1), 'us'],
      ...waited,
      ['ts-client-nokill-longest', c.ms.toFixed(1), 'ms'],
      ['ts-client-sigkill-errors', String(f.errors), 'count'],
      ['ts-client-sigkill-duplicates', String(f.dups), 'count'],
    ]);
  }
  client.close();
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
