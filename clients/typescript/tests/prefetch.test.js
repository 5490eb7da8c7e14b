'use strict';
// The prefetch buffer and the GenIds decoder without a cluster: a fake
// caller stands in for the nodes, so each test knows exactly when a refill
// lands (no timing assumptions).
const test = require('node:test');
const assert = require('node:assert/strict');
const { dirname, join } = require('node:path');
const { Prefetcher } = require('@idgen/client');

// The decoder is internal; the installed package's file, not the source tree's.
const { decodeIds } = require(join(dirname(require.resolve('@idgen/client')), 'proto.js'));

/** A caller whose refills hand out consecutive IDs, each landing after `turn` (default: one turn of the event loop). */
function fakeCaller({ turn = (f) => setImmediate(f), deadlineMs = 2000 } = {}) {
  const caller = {
    next: 1n,
    calls: 0,
    settings: { deadlineMs },
    call(_method, request) {
      caller.calls++;
      const ids = new BigUint64Array(request.count);
      for (let i = 0; i < request.count; i++) ids[i] = caller.next++;
      return new Promise((resolve) => turn(() => resolve({ value: ids, node: 'fake' })));
    },
  };
  return caller;
}

function settings(over) {
  return { batch: 1000, maxBatch: 1000, lowWater: 500, refillsInFlight: 1, maxSnowflakeAgeMs: 5000, ...over };
}

test('a caller awaiting IDs in a tight loop lets refills land before the buffer is dry', async () => {
  const caller = fakeCaller();
  const p = new Prefetcher(caller, 'MODE_LEASE', '', settings());
  const got = [];
  for (let i = 0; i < 20_000; i++) got.push(await p.nextId());
  // Only the very first call found the buffer empty: every later refill
  // landed while IDs were left, though the loop never awaited anything
  // but nextId (a loop on microtasks alone starves the event loop).
  assert.equal(p.waits, 1);
  // Handed out once each, in order.
  for (let i = 0; i < got.length; i++) assert.equal(got[i], BigInt(i + 1));
  p.close(new Error('closed'));
});

test('IDs are taken in call order by concurrent callers, each once', async () => {
  const caller = fakeCaller();
  const p = new Prefetcher(caller, 'MODE_SEGMENT', 't', settings({ batch: 100, maxBatch: 100, lowWater: 40, refillsInFlight: 2 }));
  assert.equal(await p.nextId(), 1n);
  // Calls made at once: some served from the buffer, some a turn later
  // (a refill is in flight), the rest waiting for refills.
  const calls = [];
  for (let i = 0; i < 5000; i++) calls.push(p.nextId());
  const got = await Promise.all(calls);
  assert.deepEqual(got, got.map((_, i) => BigInt(i + 2)));
  p.close(new Error('closed'));
});

test('a snowflake block is thrown away when it ages, when the loop turns and when it does not', async () => {
  const caller = fakeCaller();
  const p = new Prefetcher(caller, 'MODE_SNOWFLAKE', '', settings({ batch: 10_000, maxBatch: 10_000, lowWater: 0, maxSnowflakeAgeMs: 30 }));
  assert.equal(await p.nextId(), 1n);
  // The event loop turns past the block's age: its timer empties it.
  await new Promise((resolve) => setTimeout(resolve, 80));
  assert.equal(p.buffered, 0);
  const first = await p.nextId();
  assert.ok(first > 10_000n, `the aged block's ID ${first} was handed out`);
  // Past the age without a turn of the loop (no timer can fire): the clock
  // is read at least every CLOCK_EVERY (64) IDs, so the block ends there.
  const spinUntil = Date.now() + 80;
  while (Date.now() < spinUntil) {
    // the caller is busy; the event loop does not turn
  }
  const after = [];
  for (let i = 0; i < 64; i++) after.push(p.tryNextId());
  assert.ok(after.some((id) => id === undefined || id > 20_000n), 'IDs of an aged block kept coming');
  p.close(new Error('closed'));
});

test('a refill error reaches the waiting caller', async () => {
  const caller = {
    settings: { deadlineMs: 2000 },
    call: () => Promise.reject(Object.assign(new Error('no node answered'), { code: 'UNAVAILABLE' })),
  };
  const p = new Prefetcher(caller, 'MODE_LEASE', '', settings());
  await assert.rejects(p.nextId(), /no node answered/);
  p.close(new Error('closed'));
});

/** GenIdsResponse bytes: `values` as varints, packed in field 1 (or one field each), then an unknown field. */
function encode(values, packed) {
  const varint = (v) => {
    const out = [];
    v = BigInt(v);
    while (v >= 0x80n) {
      out.push(Number(v & 0x7fn) | 0x80);
      v >>= 7n;
    }
    out.push(Number(v));
    return out;
  };
  const body = values.flatMap(varint);
  const ids = packed ? [0x0a, ...varint(body.length), ...body] : values.flatMap((v) => [0x08, ...varint(v)]);
  // Field 2 (unknown to this decoder): a length-delimited "xy", then a varint.
  return Buffer.from([...ids, 0x12, 2, 0x78, 0x79, 0x18, ...varint(300)]);
}

test('GenIds answers decode exactly, packed or not, across every varint length', () => {
  const values = [0n, 1n, 127n, 128n, 16383n, 16384n, 2n ** 28n - 1n, 2n ** 28n, 2n ** 32n - 1n, 2n ** 32n, 2n ** 35n,
    2n ** 53n + 1n, 2n ** 56n + 3n, 2n ** 63n, 2n ** 64n - 1n, 0x0123456789abcdefn];
  // Long runs too, so the unrolled path (10 bytes left) and the checked one (the tail) both run.
  for (let i = 0n; i < 300n; i++) values.push((1n << 60n) + i * 0x1000n + i);
  for (const packed of [true, false]) {
    assert.deepEqual([...decodeIds(encode(values, packed))], values, packed ? 'packed' : 'unpacked');
  }
  assert.deepEqual([...decodeIds(Buffer.alloc(0))], []);
  assert.throws(() => decodeIds(encode([2n ** 60n], true).subarray(0, 6)), /truncated/);
  const eleven = Buffer.from([0x0a, 11, ...new Array(10).fill(0xff), 0x01, ...new Array(12).fill(0)]);
  assert.throws(() => decodeIds(eleven), /longer than 10 bytes/);
});
