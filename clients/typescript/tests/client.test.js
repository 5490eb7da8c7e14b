'use strict';
// The client against a real cluster: three idgen nodes on the Consul
// emulator (with ACLs), started by test/fixture.js.
const test = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const { execFileSync } = require('node:child_process');
const { writeFileSync } = require('node:fs');
const { join } = require('node:path');
const { Client, DiscoveryError, StrictNotPrefetchableError, DeadlineExceededError, StatusError } = require('@idgen/client');
const { Cluster, bin } = require('./fixture');

const ACL = 'consul-master-token';
const ADMIN = 'admin-token-for-tests';
let cluster;
let addrs;

test.before(async () => {
  cluster = new Cluster();
  const masterKey = join(cluster.dir, 'hide-master-key');
  writeFileSync(masterKey, 'ab'.repeat(32), { mode: 0o600 });
  await cluster.start(3, {
    acl: ACL,
    set: [
      ['admin', 'token', `"${ADMIN}"`],
      ['hide', 'master_key_file', JSON.stringify(masterKey)],
    ],
    raw: '[[formats]]\nname = "invoices"\ntemplate = "INV-{param:shop:2:alnum}-{seq:6}"\nreset = "never"\nscope_params = ["shop"]\n',
  });
  addrs = cluster.nodes.map((n) => n.grpc);
});

test.after(async () => {
  await cluster?.stop();
  // What would keep this file's process alive (a client left open).
  setTimeout(() => {
    const handles = process._getActiveHandles().map((h) => h.constructor?.name);
    console.error(`still alive after the tests: ${handles.join(', ')}`);
  }, 3000).unref();
});

/** Runs `idgen admin ...` against the first node. */
function admin(...args) {
  const env = { ...process.env, IDGEN_ADMIN__TOKEN: ADMIN };
  return execFileSync(bin('IDGEN_BIN', 'idgen'), ['admin', '--addr', addrs[0], ...args], { env, encoding: 'utf8' });
}

/** A TCP listener that accepts connections and never answers (a stalled node). */
async function blackhole() {
  const sockets = [];
  const server = net.createServer((s) => sockets.push(s));
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    addr: `127.0.0.1:${server.address().port}`,
    sockets,
    close: () => {
      sockets.forEach((s) => s.destroy());
      server.close();
    },
  };
}

/**
 * An HTTP/2 server that takes every request and never answers (a node
 * stopped after reading the call): `streams` counts the requests that
 * reached it.
 */
async function stalledNode() {
  const http2 = require('node:http2');
  const streams = [];
  const sessions = [];
  const server = http2.createServer();
  server.on('stream', (stream) => streams.push(stream));
  server.on('session', (session) => sessions.push(session));
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    addr: `127.0.0.1:${server.address().port}`,
    streams,
    close: () => {
      sessions.forEach((s) => s.destroy());
      server.close();
    },
  };
}

/** A port nothing listens on. */
async function deadPort() {
  const server = net.createServer();
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const addr = `127.0.0.1:${server.address().port}`;
  await new Promise((r) => server.close(r));
  return addr;
}

test('Consul discovery reads the ACL token from CONSUL_HTTP_TOKEN and is refused without it, naming the variable', async () => {
  const env = { CONSUL_HTTP_ADDR: cluster.consulAddr, CONSUL_HTTP_TOKEN: ACL };
  const client = await Client.connect({ consul: { env } });
  try {
    // A node's health check may flap under load: wait (bounded) for the watch to list all three.
    for (let i = 0; i < 200 && !addrs.every((a) => client.nodes().includes(a)); i++) {
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.deepEqual(client.nodes().sort(), [...addrs].sort());
    const id = await client.genId('snowflake');
    assert.equal(typeof id, 'bigint');
  } finally {
    client.close();
  }
  await assert.rejects(
    Client.connect({ consul: { env: { CONSUL_HTTP_ADDR: `http://${cluster.consulAddr}` } } }),
    (e) => e instanceof DiscoveryError && e.message.includes('CONSUL_HTTP_TOKEN') && e.message.includes('403'),
  );
  // The token file wins over the variable.
  const file = join(cluster.dir, 'consul-token');
  writeFileSync(file, `${ACL}\n`);
  const fromFile = await Client.connect({
    consul: { env: { CONSUL_HTTP_ADDR: cluster.consulAddr, CONSUL_HTTP_TOKEN: 'wrong', CONSUL_HTTP_TOKEN_FILE: file } },
  });
  try {
    assert.ok(fromFile.nodes().length > 0, 'nodes listed with the token from the file');
  } finally {
    fromFile.close();
  }
});

test('IDs are exact bigints above 2^53, and decode to the same decimal digits', async () => {
  const client = await Client.connect({ endpoints: addrs });
  try {
    const { ids } = await client.genIdsFrom('snowflake', '', 5);
    for (const id of ids) {
      assert.equal(typeof id, 'bigint');
      assert.ok(id > 2n ** 53n, `${id} is above 2^53 (the default layout's epoch makes it so)`);
      const d = await client.decodeId(id);
      assert.equal(d.id, id.toString());
    }
    // A segment tag starting above 2^53: every digit kept.
    const start = 2n ** 60n + 7n;
    admin('tags', 'create', 'above53', '--initial', start.toString());
    const seg = await client.genIds('segment', 'above53', 3);
    assert.deepEqual(seg, [start + 1n, start + 2n, start + 3n]);
    await assert.rejects(client.decodeId(12345), /never a number/);
  } finally {
    client.close();
  }
});

test('prefetch: no duplicate across refills, increasing within each node, a node killed -9 mid-run costs no error', async () => {
  const extra = await new Cluster();
  extra.consulAddr = cluster.consulAddr;
  extra.acl = ACL;
  // A fourth node of the same cluster, to kill without losing the others.
  const victim = await extra.node('victim', [['admin', 'token', `"${ADMIN}"`]]);
  const client = await Client.connect({
    endpoints: [...addrs, victim.grpc],
    deadlineMs: 3000,
    attemptMs: 500,
    prefetch: { batch: 200, maxBatch: 400 },
  });
  try {
    const seen = new Set();
    const take = async (n) => {
      for (let i = 0; i < n; i++) {
        const id = await client.nextId('snowflake');
        const key = id.toString();
        assert.ok(!seen.has(key), `duplicate ${key}`);
        seen.add(key);
      }
    };
    await take(5000);
    const killed = extra.kill(victim);
    await take(5000);
    await killed;
    await take(5000);
    assert.equal(seen.size, 15000);
    // Segment and lease buffers too.
    const seg = new Set();
    for (let i = 0; i < 3000; i++) seg.add((await client.nextId('segment', 'orders')).toString());
    assert.equal(seg.size, 3000);
    const lease = new Set();
    for (let i = 0; i < 3000; i++) lease.add((await client.nextId('lease')).toString());
    assert.equal(lease.size, 3000);
    assert.throws(() => client.prefetcher('strict', 'a/b'), StrictNotPrefetchableError);
  } finally {
    client.close();
    await extra.stop();
  }
});

test('snowflake batches from one node increase; per node the IDs keep increasing across calls', async () => {
  const client = await Client.connect({ endpoints: addrs });
  try {
    const last = new Map();
    for (let i = 0; i < 30; i++) {
      const { ids, node } = await client.genIdsFrom('snowflake', '', 50);
      for (const id of ids) {
        assert.ok(id > (last.get(node) ?? 0n), `${id} after ${last.get(node)} from ${node}`);
        last.set(node, id);
      }
    }
  } finally {
    client.close();
  }
});

test('strict calls go to the key\'s node, retried only when the request never left (refused connection)', async () => {
  const dead = await deadPort();
  const client = await Client.connect({ endpoints: [...addrs, dead], deadlineMs: 3000 });
  try {
    // Find a key whose node is the dead port: its call is retried on the next node.
    let key;
    for (let i = 0; i < 200 && !key; i++) if (client.strictNode(`ns/k${i}`) === dead) key = `ns/k${i}`;
    assert.ok(key, 'a key whose node is the dead port');
    assert.equal(await client.genId('strict', key), 1n);
    // Another key goes to its own node every time.
    const node = client.strictNode('ns/steady');
    for (let i = 1n; i <= 3n; i++) {
      const { ids, node: answered } = await client.genIdsFrom('strict', 'ns/steady', 1);
      assert.deepEqual(ids, [i]);
      assert.equal(answered, node);
    }
  } finally {
    client.close();
  }
});

test('a strict call that may have reached a node is never sent again: the error says sent, and no value was taken twice', async () => {
  const hole = await stalledNode();
  const client = await Client.connect({ endpoints: [...addrs, hole.addr], deadlineMs: 2000, attemptMs: 300 });
  try {
    let key;
    for (let i = 0; i < 200 && !key; i++) if (client.strictNode(`once/k${i}`) === hole.addr) key = `once/k${i}`;
    assert.ok(key, 'a key whose node is the stalled one');
    await assert.rejects(client.genId('strict', key), (e) => {
      assert.ok(e instanceof DeadlineExceededError, e.stack);
      assert.equal(e.sent, true);
      assert.equal(e.attempts, 1, e.message);
      assert.match(e.message, /a strict call is not sent twice/);
      return true;
    });
    assert.equal(hole.streams.length, 1, 'the stalled node received the call once');
    // No real node took a value for the key: the first value is still 1.
    const other = await Client.connect({ endpoints: addrs });
    assert.equal(await other.genId('strict', key), 1n);
    other.close();
  } finally {
    client.close();
    hole.close();
  }
});

test('a node that accepts and never answers costs one attempt budget: idempotent calls fail over within the deadline', async () => {
  const hole = await blackhole();
  const client = await Client.connect({ endpoints: [hole.addr, ...addrs], deadlineMs: 3000, attemptMs: 300 });
  try {
    for (let i = 0; i < 20; i++) assert.equal(typeof (await client.genId('snowflake')), 'bigint');
    const only = await Client.connect({ endpoints: [hole.addr], deadlineMs: 600, attemptMs: 200 });
    await assert.rejects(only.genId('snowflake'), (e) => e instanceof DeadlineExceededError && e.attempts >= 2);
    only.close();
  } finally {
    client.close();
    hole.close();
  }
});

test('UUIDs are valid v7, increase per call, and come from a prefetch buffer once each', async () => {
  const client = await Client.connect({ endpoints: addrs });
  try {
    const uuids = await client.genUuids(100);
    for (const u of uuids) assert.match(u, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    for (let i = 1; i < uuids.length; i++) assert.ok(uuids[i] > uuids[i - 1]);
    const d = await client.decodeUuid(uuids[0]);
    assert.equal(d.uuid, uuids[0]);
    // From the prefetch buffer: valid v7, none twice across refills.
    const fetched = new Set();
    for (let i = 0; i < 2500; i++) {
      const u = await client.nextUuid();
      assert.match(u, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
      fetched.add(u);
    }
    assert.equal(fetched.size, 2500);
  } finally {
    client.close();
  }
});

test('admin reveal of a hidden segment ID only with the admin token', async () => {
  admin('keys', 'create', 'users');
  admin('tags', 'create', 'users', '--hide-key', 'users');
  // The node the hide key was created on (the others load it from Consul a moment later).
  const anon = await Client.connect({ endpoints: [addrs[0]] });
  const root = await Client.connect({ endpoints: [addrs[0]], adminToken: ADMIN });
  try {
    const [id] = await anon.genIds('segment', 'users', 1);
    const publicView = await anon.decodeSegmentId('users', id);
    assert.equal(publicView.hidden, 'tag');
    assert.equal(publicView.internal_id, undefined);
    const revealed = await root.decodeSegmentId('users', id);
    assert.equal(revealed.internal_id, '1');
  } finally {
    anon.close();
    root.close();
  }
  const wrong = await Client.connect({ endpoints: [addrs[0]], adminToken: 'not-the-token' });
  await assert.rejects(wrong.decodeSegmentId('users', '1'), (e) => e instanceof StatusError && ['PERMISSION_DENIED', 'UNAUTHENTICATED'].includes(e.code));
  wrong.close();
});

test('formatted IDs: generate, parse, counter', async () => {
  const client = await Client.connect({ endpoints: addrs });
  try {
    const { ids, numeric } = await client.genFormatted('invoices', { shop: 'EU' }, 3);
    assert.equal(numeric, false);
    assert.equal(ids.length, 3);
    assert.equal(new Set(ids).size, 3);
    for (const id of ids) assert.match(id, /^INV-EU-\d{6}$/);
    const fields = await client.parseFormatted('invoices', ids[2]);
    assert.equal(fields.seq, String(Number(ids[2].slice(7))));
    assert.equal(fields.params.shop, 'EU');
    const counter = await client.formatCounter('invoices', { shop: 'EU' });
    assert.equal(counter.used, true);
    assert.ok(BigInt(counter.last) >= BigInt(fields.seq));
    await assert.rejects(client.genFormatted('no-such-format'), (e) => e instanceof StatusError && e.code === 'NOT_FOUND');
  } finally {
    client.close();
  }
});

test('a node whose server.max_batch is below the prefetch batch: the buffer lowers its batch and goes on', async () => {
  const small = new Cluster();
  small.consulAddr = cluster.consulAddr;
  small.acl = ACL;
  const node = await small.node('small', [['server', 'max_batch', '300']]);
  const client = await Client.connect({ endpoints: [node.grpc], prefetch: { batch: 1000 } });
  try {
    const seen = new Set();
    for (let i = 0; i < 2000; i++) seen.add((await client.nextId('lease')).toString());
    assert.equal(seen.size, 2000);
  } finally {
    client.close();
    await small.stop();
  }
});

test('the Consul watch follows the service: a node that joins is used without a restart', async () => {
  const env = { CONSUL_HTTP_ADDR: cluster.consulAddr, CONSUL_HTTP_TOKEN: ACL };
  const client = await Client.connect({ consul: { env } });
  const more = new Cluster();
  more.consulAddr = cluster.consulAddr;
  more.acl = ACL;
  try {
    // Nodes earlier tests stopped may still be listed until Consul reaps them.
    for (const a of addrs) assert.ok(client.nodes().includes(a), `${a} in ${client.nodes()}`);
    const joined = await more.node('joined', [['admin', 'token', `"${ADMIN}"`]]);
    let seen = false;
    for (let i = 0; i < 300 && !seen; i++) {
      seen = client.nodes().includes(joined.grpc);
      if (!seen) await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(seen, `the client learned of ${joined.grpc} from Consul: ${client.nodes()}`);
    await more.kill(joined);
    let gone = false;
    for (let i = 0; i < 300 && !gone; i++) {
      gone = !client.nodes().includes(joined.grpc);
      if (!gone) await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(gone, 'a node Consul no longer lists as passing leaves the set');
  } finally {
    client.close();
    await more.stop();
  }
});

test('the conformance driver (dist/conformance.js, the bin entry) answers the protocol line by line', async () => {
  const { spawn } = require('node:child_process');
  const { dirname } = require('node:path');
  const driver = join(dirname(require.resolve('@idgen/client/package.json')), 'dist', 'conformance.js');
  const child = spawn(process.execPath, [driver], { stdio: ['pipe', 'pipe', 'pipe'] });
  const requests = [
    { id: 1, op: 'open', discovery: 'static', nodes: addrs, tls: null, prefetch: { size: 100, low: 20 }, deadline_ms: 2000, attempt_ms: 500, admin_token: null },
    { id: 2, op: 'next', mode: 'snowflake', tag: '', count: 3 },
    { id: 3, op: 'strict_route', key: 'orders/k7' },
    { id: 4, op: 'gen', mode: 'segment', tag: 'above53', count: 1 },
    { id: 5, op: 'decode', value: '387893054096281600', mode: 'snowflake' },
    { id: 6, op: 'gen', mode: 'strict', tag: 'no such key', count: 1 },
    { id: 7, op: 'close' },
  ];
  child.stdin.end(requests.map((r) => JSON.stringify(r)).join('\n') + '\n');
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  const code = await new Promise((resolve) => child.on('exit', resolve));
  assert.equal(code, 0);
  const answers = out.trim().split('\n').map((l) => JSON.parse(l));
  assert.deepEqual(answers.map((a) => a.id), [1, 2, 3, 4, 5, 6, 7]);
  assert.deepEqual(answers[0].nodes.sort(), [...addrs].sort());
  assert.equal(answers[1].ids.length, 3);
  assert.ok(answers[1].ids.every((id) => typeof id === 'string' && BigInt(id) > 2n ** 53n));
  const direct = await Client.connect({ endpoints: addrs });
  assert.equal(answers[2].node, direct.strictNode('orders/k7'));
  direct.close();
  assert.ok(BigInt(answers[3].ids[0]) > 2n ** 60n, 'the segment tag above 2^53 stays exact as a string');
  assert.equal(answers[4].fields.id, '387893054096281600');
  assert.equal(answers[4].fields.worker_id !== undefined, true);
  assert.equal(answers[5].ok, false);
  assert.equal(answers[5].code, 'INVALID_ARGUMENT');
  assert.equal(answers[5].sent, true);
  assert.deepEqual(answers[6], { id: 7, ok: true });
});
