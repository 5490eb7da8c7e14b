'use strict';
// App-visible IDs per second from @idgen/client's prefetch buffer (three
// nodes, one event loop) against ioredis INCR on a local redis-server from
// the same loop; run by scripts/bench-ts-client.sh, which starts both.
// Prints one line per round and the medians and ratio at the end.
//
// Then one failover run: SIGKILL of one node (VICTIM_PID) under the
// prefetch load; errors, duplicates and the longest nextId call.
//
//   node ts-vs-redis.js NODE1,NODE2,NODE3 REDIS_PORT ROUNDS VICTIM_PID
// With BENCH_RESULTS=FILE the medians are also appended to FILE as
// scripts/perf-report.sh's rows.
const { Client } = require('@idgen/client');
const Redis = require('ioredis');
const { appendFileSync } = require('node:fs');

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

/** 2 M IDs with a node killed -9 after the first 500 k: errors, duplicates, the longest call. */
async function failover(ids, victim) {
  const total = 2_000_000;
  // The IDs go into one typed array, checked for duplicates after the run:
  // a Set of 2 M bigints rehashes (190 ms at a million entries) and makes
  // the collector stop the loop, which would be timed as the client's.
  const got = new BigUint64Array(total);
  let n = 0;
  let errors = 0;
  let longest = 0n;
  for (let i = 0; i < total; i++) {
    if (i === total / 4) process.kill(victim, 'SIGKILL');
    const t = process.hrtime.bigint();
    try {
      got[n] = await ids.nextId();
      n++;
    } catch {
      errors++;
    }
    const took = process.hrtime.bigint() - t;
    if (took > longest) longest = took;
  }
  const sorted = got.subarray(0, n).sort();
  let dups = 0;
  for (let i = 1; i < n; i++) if (sorted[i] === sorted[i - 1]) dups++;
  const ms = Number(longest) / 1e6;
  console.log(`failover (SIGKILL of one of 3 nodes under prefetch): ${errors} errors, ${dups} duplicates, longest nextId ${ms.toFixed(1)} ms`);
  return { errors, dups, ms };
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
    const f = await failover(ids, Number(victimArg));
    record([
      ['ts-client-sigkill-longest', f.ms.toFixed(1), 'ms'],
      ['ts-client-sigkill-errors', String(f.errors), 'count'],
      ['ts-client-sigkill-duplicates', String(f.dups), 'count'],
    ]);
  }
  client.close();
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
