'use strict';
// TLS and mTLS: a node with a certificate from `idgen tls dev-certs` that
// requires client certificates; the client's refusals say what is wrong.
const test = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const { join } = require('node:path');
const { spawn } = require('node:child_process');
const { Client, ConfigError, DiscoveryError, IdgenError } = require('@idgen/client');
const { Cluster, bin } = require('./fixture');

let cluster;
let node;
let certs;
let other;

test.before(async () => {
  cluster = new Cluster();
  certs = join(cluster.dir, 'certs');
  other = join(cluster.dir, 'other');
  execFileSync(bin('IDGEN_BIN', 'idgen'), ['tls', 'dev-certs', certs], { stdio: 'ignore' });
  execFileSync(bin('IDGEN_BIN', 'idgen'), ['tls', 'dev-certs', other], { stdio: 'ignore' });
  await cluster.consul();
  node = await cluster.node('tls', [
    ['server', 'tls', `{ cert = ${JSON.stringify(join(certs, 'node.pem'))}, key = ${JSON.stringify(join(certs, 'node-key.pem'))}, client_ca = ${JSON.stringify(join(certs, 'ca.pem'))}, client_required = true }`],
  ]);
});

test.after(async () => {
  await cluster?.stop();
});

const opts = (tls) => ({ endpoints: [node.grpc], deadlineMs: 1500, attemptMs: 500, tls });

test('mTLS with the right CA and a client certificate gives IDs', async () => {
  const client = await Client.connect(
    opts({ caFile: join(certs, 'ca.pem'), certFile: join(certs, 'client.pem'), keyFile: join(certs, 'client-key.pem') }),
  );
  try {
    assert.equal(typeof (await client.genId('snowflake')), 'bigint');
  } finally {
    client.close();
  }
});

test('a wrong CA is refused with words that name the CA', async () => {
  const client = await Client.connect(
    opts({ caFile: join(other, 'ca.pem'), certFile: join(certs, 'client.pem'), keyFile: join(certs, 'client-key.pem') }),
  );
  try {
    await assert.rejects(client.genId('snowflake'), (e) => {
      assert.ok(e instanceof IdgenError, String(e));
      assert.match(e.message, /not trusted: check the CA/);
      return true;
    });
  } finally {
    client.close();
  }
});

test('no client certificate for a node that requires one: the error says to set one', async () => {
  const client = await Client.connect(opts({ caFile: join(certs, 'ca.pem') }));
  try {
    await assert.rejects(client.genId('snowflake'), (e) => {
      assert.ok(e instanceof IdgenError, String(e));
      assert.match(e.message, /client certificate/);
      return true;
    });
  } finally {
    client.close();
  }
});

test('TLS files that are missing or not PEM are configuration errors naming them', async () => {
  await assert.rejects(Client.connect(opts({ caFile: join(certs, 'nope.pem') })), (e) => e instanceof ConfigError && e.code === 'CONFIG' && /nope\.pem/.test(e.message));
  await assert.rejects(Client.connect(opts({ ca: 'not a certificate' })), (e) => e instanceof ConfigError && /PEM/.test(e.message));
  await assert.rejects(Client.connect(opts({ caFile: join(certs, 'ca.pem'), certFile: join(certs, 'client.pem') })), (e) => e instanceof ConfigError && /both/.test(e.message));
});

test('Consul over HTTPS: CONSUL_CACERT is used, its absence is named, a wrong CA is refused', async () => {
  const proc = spawn(
    bin('CONSUL_TESTSERVER', 'consul-testserver'),
    ['--listen', '127.0.0.1:0', '--https-cert', join(certs, 'node.pem'), '--https-key', join(certs, 'node-key.pem')],
    { stdio: ['ignore', 'pipe', 'ignore'] },
  );
  try {
    const addr = await new Promise((resolve, reject) => {
      proc.stdout.on('data', (d) => {
        const m = /listening on (\S+)/.exec(String(d));
        if (m) resolve(m[1]);
      });
      proc.on('exit', () => reject(new Error('consul-testserver exited')));
    });
    const env = { CONSUL_HTTP_ADDR: `https://${addr}`, CONSUL_CACERT: join(certs, 'ca.pem') };
    const client = await Client.connect({ consul: { env } });
    assert.deepEqual(client.nodes(), [], 'no idgen node registered there');
    client.close();
    await assert.rejects(
      Client.connect({ consul: { env: { CONSUL_HTTP_ADDR: `https://${addr}` } } }),
      (e) => e instanceof ConfigError && /CONSUL_CACERT/.test(e.message),
    );
    await assert.rejects(
      Client.connect({ consul: { env: { CONSUL_HTTP_ADDR: addr, CONSUL_HTTP_SSL: 'true', CONSUL_CACERT: join(other, 'ca.pem') } } }),
      (e) => e instanceof DiscoveryError && /CONSUL_CACERT/.test(e.message),
    );
  } finally {
    proc.kill('SIGKILL');
  }
});
