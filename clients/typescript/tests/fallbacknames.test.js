'use strict';
// A fallback datacenter the Consul agent does not list is refused at
// start-up with the Rust crate's words (client/src/discovery.rs); an agent
// that does not answer /v1/catalog/datacenters is not refused. A fake
// Consul on 127.0.0.1:0: one node in the health answer, the listing as
// each test sets it.
const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { Client, ConfigError } = require('@idgen/client');

/** A fake agent; `datacenters` null: the listing answers 404. */
async function fakeConsul(datacenters) {
  const tokens = [];
  const server = http.createServer((req, res) => {
    const send = (status, body) => {
      res.writeHead(status, { 'X-Consul-Index': '7', 'Content-Type': 'application/json' });
      res.end(body);
    };
    if (req.url.startsWith('/v1/catalog/datacenters')) {
      tokens.push(req.headers['x-consul-token']);
      if (datacenters === null) return send(404, 'no such endpoint');
      return send(200, JSON.stringify(datacenters));
    }
    if (req.url.startsWith('/v1/health/service/')) {
      return send(200, JSON.stringify([{ Node: { Address: '127.0.0.1' }, Service: { Address: '127.0.0.1', Port: 1 } }]));
    }
    return send(404, '');
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = `http://127.0.0.1:${server.address().port}`;
  const close = () =>
    new Promise((resolve) => {
      server.closeAllConnections();
      server.close(resolve);
    });
  return { address, tokens, close };
}

const connect = (consul, fallbackDatacenters) =>
  Client.connect({ consul: { address: consul.address, token: 't0k', waitMs: 1000, fallbackDatacenters } });

test('an unknown fallback datacenter is refused at start-up, naming the ones the agent knows', async () => {
  const consul = await fakeConsul(['dc1', 'dc2']);
  try {
    await assert.rejects(connect(consul, ['DC2']), (e) => {
      assert.ok(e instanceof ConfigError);
      assert.equal(e.code, 'CONFIG');
      assert.equal(
        e.message,
        'invalid client configuration: fallback datacenter(s) ["DC2"] unknown to the Consul agent, which knows ["dc1", "dc2"]: name Consul datacenters (case matters)',
      );
      return true;
    });
    assert.deepEqual(consul.tokens, ['t0k']);
    const client = await connect(consul, ['dc2']);
    try {
      assert.deepEqual(client.nodes(), ['127.0.0.1:1']);
    } finally {
      client.close();
    }
  } finally {
    await consul.close();
  }
});

test('an agent that does not answer the datacenter listing is not refused', async () => {
  const consul = await fakeConsul(null);
  try {
    const client = await connect(consul, ['DC2']);
    try {
      assert.deepEqual(client.nodes(), ['127.0.0.1:1']);
    } finally {
      client.close();
    }
    assert.deepEqual(consul.tokens, ['t0k']);
  } finally {
    await consul.close();
  }
});
