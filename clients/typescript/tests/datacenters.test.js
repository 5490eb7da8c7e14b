'use strict';
// Falling back to another Consul datacenter (consul.fallbackDatacenters),
// against real nodes: the Consul emulator with two linked datacenters,
// dc1 (the client's own, the primary) and dc2, a node in each with its own
// node.datacenter_id. dc1's node killed -9 under load: snowflake IDs go on
// through dc2 with no error and no duplicate; strict and segment calls are
// refused there (their counters are per datacenter) unless the client
// opted in; dc1's node back: calls return to it. As the Rust crate's
// tests/client_datacenters.rs and the Python client's test_datacenters.py.
const test = require('node:test');
const assert = require('node:assert/strict');
const { Client, CrossesDatacentersError } = require('@idgen/client');
const { Cluster } = require('./fixture');

const datacenterOf = (id) => Number((id >> 17n) & 0x1fn);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Waits (at most 20 s) until `client` uses exactly `node`. */
async function waitNodes(client, node) {
  for (let i = 0; i < 400; i++) {
    if (client.nodes().join() === node) return;
    await sleep(50);
  }
  assert.fail(`the client uses ${client.nodes()}, not [${node}]`);
}

async function refused(call, counter) {
  await assert.rejects(call, (e) => {
    assert.ok(e instanceof CrossesDatacentersError, String(e));
    assert.equal(e.code, 'UNAVAILABLE');
    assert.equal(e.sent, false);
    for (const words of [
      counter,
      'the local Consul datacenter "dc1" has no passing idgen node',
      'fallback datacenter "dc2"',
      'counters_may_cross_datacenters',
    ]) {
      assert.ok(e.message.includes(words), `${words} missing from: ${e.message}`);
    }
    return true;
  });
}

test('with the local datacenter gone, snowflake goes on through the fallback and counters stay home', async () => {
  const cluster = new Cluster();
  try {
    await cluster.consul(undefined, ['dc2']);
    const node = (name, dc, id) =>
      cluster.node(name, [
        ['consul', 'address', `"http://${cluster.agents[dc]}"`],
        ['consul', 'primary_datacenter', '"dc1"'],
        ['node', 'datacenter_id', String(id)],
      ]);
    let a = await node('a', 'dc1', 1);
    const b = await node('b', 'dc2', 2);
    await cluster.passing(1, cluster.agents.dc1);
    await cluster.passing(1, cluster.agents.dc2);
    const connect = (countersMayCrossDatacenters) =>
      Client.connect({
        consul: {
          address: `http://${cluster.agents.dc1}`,
          env: {},
          waitMs: 5000,
          fallbackDatacenters: ['dc2'],
          fallbackRecheckMs: 500,
          countersMayCrossDatacenters,
        },
        deadlineMs: 8000,
        setAsideMs: 300,
        prefetch: { batch: 100 },
      });
    const client = await connect(false);
    const crossing = await connect(true);
    let stop = false;
    try {
      assert.deepEqual(client.nodes(), [a.grpc], 'local first');
      const strictBefore = await client.genId('strict', 'seats/a1');
      const got = [];
      const errors = [];
      const load = async (prefetched) => {
        while (!stop) {
          try {
            got.push(prefetched ? await client.nextId('snowflake') : await client.genId('snowflake'));
          } catch (e) {
            errors.push(String(e));
          }
          await sleep(1);
        }
      };
      const tasks = [0, 1, 2, 3].map((t) => load(t % 2 === 0));
      await sleep(500);
      await cluster.kill(a);
      await waitNodes(client, b.grpc);
      await sleep(700);
      await refused(client.genId('strict', 'seats/a1'), 'strict key "seats/a1"');
      await refused(client.genIds('segment', 'orders', 3), 'segment tag "orders"');
      await refused(client.nextId('segment', 'orders'), 'segment tag "orders"');
      await waitNodes(crossing, b.grpc);
      await crossing.genId('strict', 'seats/a1'); // the user opted in

      a = await node('a', 'dc1', 1);
      await waitNodes(client, a.grpc);
      await sleep(300);
      stop = true;
      await Promise.all(tasks);
      assert.deepEqual(errors, [], 'the application saw errors');
      assert.equal(new Set(got).size, got.length, 'an ID was handed out twice');
      assert.deepEqual(new Set(got.map(datacenterOf)), new Set([1, 2]), 'IDs from both datacenters');
      const seen = new Set(got);
      for (let i = 0; i < 20; i++) {
        const id = await client.genId('snowflake');
        assert.equal(datacenterOf(id), 1, 'back on the local datacenter');
        assert.ok(!seen.has(id));
      }
      assert.ok((await client.genId('strict', 'seats/a1')) > strictBefore);
    } finally {
      stop = true; // a failed assertion ends the load loops too
      client.close();
      crossing.close();
    }
  } finally {
    await cluster.stop();
  }
});
